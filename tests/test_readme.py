"""The README's Python API section runs as written: its code blocks, in order, in one namespace
(in a temporary folder, where its export lands)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def _api_blocks() -> list[str]:
  text = README.read_text()
  section = text.split("\n## Python API\n", 1)[1].split("\n## ", 1)[0]
  return re.findall(r"```python\n(.*?)```", section, re.DOTALL)


@pytest.mark.slow
def test_the_python_api_section_runs(tmp_path, monkeypatch, capsys):
  blocks = _api_blocks()
  assert len(blocks) >= 3  # training and a sweep, an export, real text
  monkeypatch.chdir(tmp_path)
  namespace: dict = {}
  for block in blocks:
    exec(compile(block, str(README), "exec"), namespace)  # noqa: S102
  assert "recall@M" in capsys.readouterr().out
  assert namespace["out"]["eval_final"]["recall_at_m"].shape == (12,)
  assert namespace["after"]["recall_at_m"] > namespace["before"]["recall_at_m"]
  assert (tmp_path / "latent.safetensors").is_file()
  assert namespace["scorer"].score(namespace["eval_batch"].q_BxD[0],
                                   namespace["eval_batch"].mem_BxKxD[0]).shape == (20,)
  assert namespace["chosen"].shape == (2,)


ROOT = README.parent
DOCUMENTS = [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "experiments" / "README.md"]


def _anchor(heading: str) -> str:
  """GitHub's anchor of a heading: lower case, punctuation gone, spaces as hyphens."""
  return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_of_the_documents_resolves_inside_the_repository():
  broken = []
  for doc in DOCUMENTS:
    text = doc.read_text()
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
      if re.match(r"[a-z]+://", target):
        broken.append(f"{doc.name}: {target} (outside the repository)")
        continue
      path, _, anchor = target.partition("#")
      file = (doc.parent / path).resolve() if path else doc
      if not file.exists() or ROOT not in file.parents and file != ROOT:
        broken.append(f"{doc.relative_to(ROOT)}: {target}")
      elif anchor and file.suffix == ".md":
        anchors = {_anchor(h) for h in re.findall(r"^#+ (.+)$", file.read_text(), re.M)}
        if anchor not in anchors:
          broken.append(f"{doc.relative_to(ROOT)}: {target} (no such heading)")
  assert not broken, "links that do not resolve:\n" + "\n".join(broken)
  # Nothing points at files outside the repository (the design notes beside it included).
  for doc in DOCUMENTS:
    assert "shared/DESIGN" not in doc.read_text(), doc


def test_the_accelerator_check_names_only_tests_that_exist():
  """experiments/accelerator_check.sh runs on machines the suite never sees: a test file it
  names that was moved would make its parity step collect nothing."""
  script = (ROOT / "experiments" / "accelerator_check.sh").read_text()
  named = re.findall(r"\btests/[\w/.]+", script)
  assert len(named) >= 5
  assert [p for p in named if not (ROOT / p).exists()] == []
