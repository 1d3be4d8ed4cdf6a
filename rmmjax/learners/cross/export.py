"""A trained cross reranker as a Hugging Face directory that sentence-transformers' CrossEncoder
loads (docs/command-line.md, export), with the export's manifest `rmmjax.json`. Its config names
the identity as the activation, under the keys of sentence-transformers 3.x and 4+, which
otherwise put a sigmoid on a one-label model."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from rmmjax.encode.bert import param_at, weight_names
from rmmjax.encode.export import TOKENIZER_FILES
from rmmjax.io.trained import export_manifest, load_trained_params
from rmmjax.encode.encoder import SentenceEncoder
from rmmjax.io.outputs import check_export_dir
from rmmjax.io.manifest import RUN_FILE
from rmmjax.io.workdir import (atomic_path, atomic_write_json, read_config, replace_dir,
                               write_run_record)
from rmmjax.learners.cross.spec import check_trained_beside, restore

IDENTITY = "torch.nn.modules.linear.Identity"
HOW_TO_SCORE = (
    "score(question, memory at base position k) = CrossEncoder(DIR).predict([(question, "
    "memory)]) + rank_bias[k]: the pair's logit (activation: identity) plus the rank prior of "
    "the candidate's position in the base retriever's order (0 = its best). Ranking the K "
    "candidates by the logit alone drops the prior, which the reranker was trained with.")


def served_files(out: Path) -> dict[str, str]:
  """The sha256 of each file sentence-transformers builds the served model from besides the
  weights, which rmmjax does not read: a changed one would serve other scores than rmmjax's."""
  return {name: hashlib.sha256((out / name).read_bytes()).hexdigest()
          for name in ("config.json", *TOKENIZER_FILES) if (out / name).is_file()}


def hf_name(name: str) -> str:
  """A `weight_names(cfg, head=True)` name as BertForSequenceClassification's file holds it."""
  return name if name.startswith("classifier.") else "bert." + name


def export_cross(params: dict, cfg, base_dir: Path, out: Path, manifest: dict,
                 max_length: int) -> Path:
  """Writes the directory (module docstring) beside `base_dir`, the encoder it started from."""
  out, tensors = Path(out), {}
  for path, name, transposed in weight_names(cfg, head=True):
    value = np.asarray(param_at(params["encoder"], path), np.float32)
    if not np.all(np.isfinite(value)):
      raise ValueError(f"the cross reranker's {hf_name(name)} holds non-finite values; refusing "
                       "to export")
    tensors[hf_name(name)] = np.ascontiguousarray(value.T if transposed else value)
  out.mkdir(parents=True, exist_ok=True)
  config = json.loads((Path(base_dir) / "config.json").read_text())
  config |= {"architectures": ["BertForSequenceClassification"], "num_labels": 1,
             "id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0},
             "sentence_transformers": {"activation_fn": IDENTITY},
             "sbert_ce_default_activation_function": IDENTITY}
  atomic_write_json(out / "config.json", config)
  for name in TOKENIZER_FILES:
    if (Path(base_dir) / name).exists():
      shutil.copyfile(Path(base_dir) / name, out / name)
  tokenizer_config = out / "tokenizer_config.json"
  if tokenizer_config.exists():  # the pair length rmmjax scored with
    data = json.loads(tokenizer_config.read_text())
    atomic_write_json(tokenizer_config, data | {"model_max_length": max_length})
  with atomic_path(out / "model.safetensors") as tmp:
    save_file(tensors, str(tmp), metadata={"format": "pt"})
  write_run_record(out, manifest | {
      "how_to_score": HOW_TO_SCORE, "max_length": max_length,
      "rank_bias": np.asarray(params["rank_bias"], np.float32).tolist(),
      "served_files": served_files(out)})
  return out


EXPORT_NAME = "reranker"  # its name in a two-stage export


def export_run(workdir: Path, out: Path) -> str:
  """The workdir's cross reranker as the directory `out` (nothing half-written on a failure),
  beside the packaged encoder it started from; says what was written."""
  check_export_dir(out, "a cross reranker exports as a directory (a CrossEncoder's)")
  workdir, out, encoder = Path(workdir), Path(out), SentenceEncoder()
  spec, template = restore(read_config(workdir), workdir)
  params, _, step = load_trained_params(workdir, spec, template)
  manifest = export_manifest(workdir)
  record = manifest["record"]
  check_trained_beside(record, encoder, str(workdir),
                       ": export it beside the encoder it started from")
  if out.exists() and any(out.iterdir()):
    raise ValueError(f"--out {out} exists and is not empty; choose a new directory")
  with replace_dir(out) as staging:
    # (a folder holding the reranker alone: learner=reranker, in a two-stage export too)
    export_cross(params, spec.model.bert, encoder.model_dir, staging,
                 manifest | {"learner": "reranker", "record": record | {"step": step}},
                 record["cross"]["max_length"])
  return (f"wrote {out}: a Hugging Face directory that sentence_transformers.CrossEncoder "
          f"loads; {out / RUN_FILE} says how rmmjax's score adds the rank prior to its "
          "logit")
