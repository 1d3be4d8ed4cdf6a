# The two set-up commands: `make demo` (train on the embedded default) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test bench

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Installs the package (editable) with its test extra; reruns only when pyproject.toml changes.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $@

demo: $(VENV)/.installed
	$(BIN)/rmmjax train --config latent --workdir checkpoints/latent

test: $(VENV)/.installed
	$(BIN)/python -m pytest

bench: $(VENV)/.installed
	$(BIN)/rmmjax bench core --out checkpoints/bench_core.json
