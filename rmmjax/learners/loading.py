"""Loading a trained reranker for evaluation or serving: from a training workdir, an exported
.safetensors file (its header) or an exported cross reranker's directory."""

from __future__ import annotations

from pathlib import Path

import jax.numpy as jnp
from flax import traverse_util

from rmmjax import core
from rmmjax.io.trained import load_trained_params, read_record
from rmmjax.io.kinds import refuse_unless
from rmmjax.learners.embedding.format import read_reranker
from rmmjax.io.workdir import read_config
from rmmjax.learners.cross.load import cross_export_header, load_cross_export
from rmmjax.learners.loaded import LoadedReranker
from rmmjax.learners.registry import learner


# What --reranker takes (io.kinds).
RERANKER_KINDS = ("reranker", "reranker file", "both", "reranker export")


def reranker_record(path: Path) -> dict:
  """What a reranker (a workdir or an exported file) was trained on, without its weights."""
  path = Path(path)
  kind = refuse_unless(path, "--reranker", RERANKER_KINDS)
  if kind == "reranker export":
    return cross_export_header(path)["record"]
  if path.is_dir():
    return read_record(path)
  return load_reranker(path).record


def load_reranker(path: Path) -> LoadedReranker:
  """A trained reranker from a training workdir or an exported .safetensors file."""
  path = Path(path)
  if refuse_unless(path, "--reranker", RERANKER_KINDS) == "reranker export":
    return load_cross_export(path)
  if path.is_dir():
    record, cfg = read_record(path), read_config(path)
    spec, template = learner(cfg.variant).restored(cfg, path)
    params, cfg, step = load_trained_params(path, spec, template)
    return LoadedReranker(str(path), params, spec, cfg.hparams(), record, step, cfg.steps)
  if path.suffix != ".safetensors":
    raise ValueError(f"--reranker {path}: expected a training workdir or an exported "
                     ".safetensors file")
  weights, meta = read_reranker(path)
  spec = core.CoreSpec(variant=meta["variant"], dim=int(meta["dim"]), k=int(meta["k"]),
                       m=int(meta["m"]), batch=int(meta["batch"]),
                       hidden=int(meta.get("hidden") or 256), rank_prior=bool(meta["rank_prior"]),
                       model=learner(meta["variant"]).task.model)
  # ({"q_mlp/w1": x} -> {"q_mlp": {"w1": x}}: the export's flattening undone)
  params = traverse_util.unflatten_dict({k: jnp.asarray(v) for k, v in weights.items()}, sep="/")
  return LoadedReranker(str(path), params, spec, core.HParams.create(**meta["hparams"]),
                        meta["record"], meta.get("step"))
