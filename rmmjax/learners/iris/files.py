"""The learned IRIS models of a learner=iris workdir or its export: anchor_encoder/,
judge.safetensors and the refinement encoder (the run's checkpoints, or refine_encoder/)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
from flax import traverse_util
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from rmmjax.encode.encoder import SentenceEncoder
from rmmjax.encode.export import save_encoder
from rmmjax.io.outputs import check_export_dir
from rmmjax.io.trained import export_manifest
from rmmjax.io.kinds import model_kind, refuse_unless
from rmmjax.io.manifest import another_version, read_run_record
from rmmjax.io.workdir import atomic_path, read_config, write_run_record
from rmmjax.encode.tuned import TunedQueryEncoder
from rmmjax.learners.query_encoder.files import latest_encoder_params
from rmmjax.encode.protocol import encoder_identity

JUDGE_FILE, ANCHOR_DIR, REFINE_DIR = "judge.safetensors", "anchor_encoder", "refine_encoder"
JUDGE_FORMAT = "rmmjax-sufficiency-judge-1"
HOW_TO_SCORE = (
    "rmmjax.core.judge.judge_logit(params, q_D, facts_NxD, mask_N): q_D the question embedded "
    "by the anchor encoder, facts_NxD the gathered facts embedded by the base encoder named in "
    "'encoder'; sigmoid(logit) is the probability that the facts cover every evidence turn. "
    "Tensors are params flattened with '.' (fact.w, fact.b, attend, head.w, head.b, out.w, out.b).")


@dataclasses.dataclass(frozen=True)
class IrisModel:
  anchor: TunedQueryEncoder
  refine: TunedQueryEncoder
  judge: dict
  record: dict
  source: str


def save_judge(params: dict, path: Path, metadata: dict) -> None:
  flat = {k: np.asarray(v) for k, v in traverse_util.flatten_dict(params, sep=".").items()}
  with atomic_path(path) as tmp:
    save_file(flat, str(tmp), metadata={"rmmjax_format": JUDGE_FORMAT,
                                        "how_to_score": HOW_TO_SCORE,
                                        **{k: json.dumps(v) for k, v in metadata.items()}})


def load_judge(path: Path) -> tuple[dict, dict]:
  with safe_open(str(path), "numpy") as f:
    header = f.metadata() or {}
  if header.get("rmmjax_format") != JUDGE_FORMAT:
    raise another_version(str(path), f"judge format {header.get('rmmjax_format')!r}",
                          f"judge format {JUDGE_FORMAT!r}", "export its training workdir again")
  meta = {k: json.loads(v) for k, v in header.items() if k not in ("rmmjax_format", "how_to_score")}
  return traverse_util.unflatten_dict(load_file(str(path)), sep="."), meta


def is_iris_model(path: Path) -> bool:
  """Whether `path` is a learner=iris workdir or its export."""
  return model_kind(path) in ("iris", "iris export")


def load_iris_model(path: Path, encoder) -> IrisModel:
  """The learned IRIS of a learner=iris workdir or export, beside the facts' base `encoder`."""
  path = Path(path)
  if not path.is_dir():
    raise FileNotFoundError(f"--iris-model {path}: expected a learner=iris workdir or its export")
  exported = refuse_unless(path, "--iris-model", ("iris", "iris export")) == "iris export"
  for need in (ANCHOR_DIR, JUDGE_FILE):
    if not (path / need).exists():
      raise FileNotFoundError(
          f"--iris-model {path} has no {need}: " + (
              "an incomplete export; export the workdir again" if exported else
              "its training has not got past fitting the models; run it again to finish"))
  judge, meta = load_judge(path / JUDGE_FILE)
  record = meta.get("record", {})
  # The identity names the weights, so the encoders and the judge read this one's dimension.
  if record.get("encoder") != encoder_identity(encoder):
    raise ValueError(f"--iris-model {path} was trained on facts embedded by "
                     f"{record.get('encoder')!r}; these are embedded by "
                     f"{encoder_identity(encoder)!r}")
  anchor = TunedQueryEncoder(encoder, SentenceEncoder(path / ANCHOR_DIR).params)
  refine = TunedQueryEncoder(encoder, SentenceEncoder(path / REFINE_DIR).params if exported else
                             latest_encoder_params(path, read_config(path), encoder,
                                                   "refinement encoder yet"))
  return IrisModel(anchor, refine, judge, record, str(path))


def export_run(workdir: Path, out: Path) -> str:
  """A learner=iris workdir's models as files in the directory `out`; says what was written."""
  out = check_export_dir(out, "learned IRIS models export as a directory (two encoders and a "
                             "judge)")
  encoder = SentenceEncoder()
  model = load_iris_model(workdir, encoder)
  there = read_run_record(out) or {}
  if there.get("kind") in ("train", "sweep"):
    raise ValueError(f"--out {out} is a training workdir; give a new or empty folder")
  if out.exists() and any(out.iterdir()) and there.get("learner") != "iris":
    raise ValueError(f"--out {out} is a folder with other files; give a new or empty one")
  out.mkdir(parents=True, exist_ok=True)
  manifest = export_manifest(workdir)
  for name, tuned, role in ((ANCHOR_DIR, model.anchor, "embed the question (first search)"),
                            (REFINE_DIR, model.refine, "embed the question joined with the best "
                             "facts found (refinement search)")):
    save_encoder(encoder, tuned.params, out / name,
                 metadata={"identity": tuned.identity, "role": role})
  save_judge(model.judge, out / JUDGE_FILE, {"record": manifest["record"]})
  write_run_record(out, manifest)  # last: a folder without it is no export
  return (f"wrote {out}: anchor_encoder/ and refine_encoder/ (Hugging Face-format encoders of "
          "the questions) and judge.safetensors (its header says how to score it); use it as "
          "--iris-model")
