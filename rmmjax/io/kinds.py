"""What a model path given on the command line holds, as its manifest says, so that a model
passed to the flag of another kind is refused saying which flag takes it, not deep in a loader."""

from __future__ import annotations

from pathlib import Path

from rmmjax.io.manifest import another_format, read_run_record, stopped_in_first_stage

# kind: (what it is, how it is used). A folder's kind is its manifest's learner (a reranker
# family's is a reranker's, a list of stages' is "both"), followed by " export" in an export's.
KINDS = {
    "reranker": ("a reranker's training workdir", "--reranker"),
    "reranker file": ("an exported reranker", "--reranker"),
    "reranker export": ("an exported cross reranker (a sentence-transformers CrossEncoder "
                        "directory)", "--reranker, or sentence_transformers.CrossEncoder"),
    "both": ("a learner=query_encoder,FAMILY workdir (a tuned query encoder and a reranker "
             "over its candidates)", "--reranker (which brings its query encoder)"),
    "both export": ("an export of learner=query_encoder,FAMILY (its query_encoder/ and its "
                    "reranker)",
                    "--reranker DIR/reranker.safetensors or DIR/reranker (whichever it holds), "
                    "which brings DIR/query_encoder beside it"),
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
}
EXPORTS = ("reranker file", "reranker export", "both export", "query encoder export",
           "iris export")


def model_kind(path: Path) -> str | None:
  """One of KINDS for what `path` holds: a folder's as its manifest says (refused when of
  another format), an exported reranker file's by its name (its header describes it); "empty"
  or "no manifest" (a Hugging Face encoder at most) for a folder without one; None otherwise."""
  path = Path(path)
  if path.is_file():
    return "reranker file" if path.suffix == ".safetensors" else None
  if not path.is_dir():
    return None
  run = read_run_record(path)
  if run is None:
    return "no manifest" if any(path.iterdir()) else "empty"
  if run["kind"] == "sweep":
    return "sweep"
  learner = str(run.get("learner"))
  kind = (learner.replace("_", " ") if learner.replace("_", " ") in KINDS
          else "both" if "," in learner else "reranker")
  return kind + (" export" if run["kind"] == "export" else "")


def refuse_unless(path: Path, flag: str, wanted: tuple[str, ...],
                  expected: str | None = None) -> str | None:
  """The kind of `path` when it is one of `wanted` (None when unrecognised: the loader then says
  what is missing); else refused, naming what it is and `expected` or the flag that takes it."""
  kind = model_kind(path)
  if kind is None or kind in wanted:
    return kind
  named = f"{flag}{'' if flag.endswith('=') else ' '}{path}"
  if kind == "empty":
    raise ValueError(f"{named} is an empty directory: it holds no model")
  if kind == "no manifest":
    raise stopped_in_first_stage(path) or another_format(
        f"{named} holds", 0, "export its training workdir again (a folder rmmjax did not write "
        "holds no model it reads)")
  what, use = KINDS[kind]
  raise ValueError(f"{named} is {what}; " + (f"expected {expected}" if expected is not None else
                                             f"it is used through {use.replace('DIR', str(path))}"))
