"""What a model path given on the command line holds, so that a model passed to the flag of
another kind is refused with what it is and which flag takes it (not with "tree structures do
not match" or "unknown config keys" from deep inside a loader)."""

from __future__ import annotations

import json
from pathlib import Path

from rmmjax.encode.export import EXPORT_RECORD
from rmmjax.io.manifest import EARLIER, RUN_FILE, read_run_record

# The files of learned IRIS models (rmmjax.io.iris_models writes them).
JUDGE_FILE, ANCHOR_DIR, REFINE_DIR = "judge.safetensors", "anchor_encoder", "refine_encoder"

# kind: (what it is, how it is used)
KINDS = {
    "reranker": ("a reranker's training workdir", "--reranker"),
    "reranker file": ("an exported reranker", "--reranker"),
    "both": ("a learner=both workdir (a tuned query encoder and a reranker over its "
             "candidates)", "--reranker (which brings its query encoder)"),
    "both export": ("an export of learner=both", "--reranker DIR/reranker.safetensors with "
                    "--encoder DIR/query_encoder"),
    "both cross export": ("an export of a learner=both cross reranker (its reranker/ and "
                          "query_encoder/)", "--reranker DIR/reranker (which brings "
                          "DIR/query_encoder beside it)"),
    "query encoder": ("a tuned query encoder's training workdir (learner=query_encoder)",
                      "--encoder"),
    "query encoder export": ("an exported tuned query encoder (a Hugging Face directory)",
                             "--encoder"),
    "iris": ("a learner=iris workdir (IRIS's learned anchor, refinement encoder and judge)",
             "--iris-model, with --iris"),
    "iris export": ("an export of learner=iris (IRIS's learned models)",
                    "--iris-model, with --iris"),
    "sweep": ("a sweep's workdir (it holds no trained model)",
              "DIR/best, the sweep's best configuration trained on every conversation (a sweep "
              "run with --no-best trains none: train one with the row's settings)"),
    "encoder": ("a Hugging Face sentence encoder directory", "--model (embed) or --encoder"),
    "cross export": ("an exported cross reranker (a sentence-transformers CrossEncoder "
                     "directory)", "--reranker, or sentence_transformers.CrossEncoder"),
    "empty": ("an empty directory (it holds no model)", "nothing: train or export a model into "
              "it first"),
}
EXPORTS = ("reranker file", "both export", "both cross export", "query encoder export",
           "iris export", "encoder", "cross export")
CROSS_RECORD = "rmmjax_cross.json"  # what marks an exported cross reranker


def model_kind(path: Path) -> str | None:
  """One of KINDS for what `path` holds, or None when it is none of them."""
  path = Path(path)
  if path.is_file():
    return "reranker file" if path.suffix == ".safetensors" else None
  if not path.is_dir():
    return None
  if (path / RUN_FILE).is_file() or any((path / name).exists() for name in EARLIER):
    run = read_run_record(path)  # (the manifest says what it is; refused without one)
    if run["kind"] == "sweep":
      return "sweep"
    return {"query_encoder": "query encoder", "iris": "iris", "both": "both"}.get(
        run.get("learner"), "reranker")
  if (path / JUDGE_FILE).is_file() or (path / REFINE_DIR).is_dir():
    return "iris export"
  if (path / "reranker.safetensors").is_file() and (path / "query_encoder").is_dir():
    return "both export"
  if (path / "reranker" / CROSS_RECORD).is_file() and (path / "query_encoder").is_dir():
    return "both cross export"
  if (path / CROSS_RECORD).is_file() or _is_cross_encoder(path):
    return "cross export"  # (without its header the loader says what is missing)
  if (path / "model.safetensors").is_file():
    return "query encoder export" if (path / EXPORT_RECORD).is_file() else "encoder"
  if not any(path.iterdir()):
    return "empty"
  return None


def _is_cross_encoder(path: Path) -> bool:
  """A Hugging Face directory of a sequence classifier (what a cross reranker exports as)."""
  try:
    config = json.loads((path / "config.json").read_text())
  except (OSError, ValueError):
    return False
  return isinstance(config, dict) and "BertForSequenceClassification" in (
      config.get("architectures") or [])


def refuse_unless(path: Path, flag: str, wanted: tuple[str, ...],
                  expected: str | None = None) -> str | None:
  """The kind of `path` when it is one of `wanted` (or None when unrecognised: the loader's
  own checks then say what is missing); refused, naming what it is and its flag (or, where the
  path is not given to a flag, `expected`), otherwise."""
  kind = model_kind(path)
  if kind is None or kind in wanted:
    return kind
  what, use = KINDS[kind]
  if kind == "empty":
    raise ValueError(f"{flag}{'' if flag.endswith('=') else ' '}{path} is an empty directory: "
                     "it holds no model")
  if expected is not None:
    raise ValueError(f"{flag}{path} is {what}; expected {expected}")
  raise ValueError(f"{flag} {path} is {what}; it is used through {use.replace('DIR', str(path))}")
