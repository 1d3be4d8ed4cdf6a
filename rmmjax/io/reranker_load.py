"""Loading a trained reranker for evaluation or serving: from a training workdir (its newest
readable checkpoint, config and record) or from an exported .safetensors file (its header)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from rmmjax import core
from rmmjax.io.export import load_trained_params, read_record
from rmmjax.io.kinds import refuse_unless
from rmmjax.io.reranker_format import read_reranker


@dataclasses.dataclass(frozen=True)
class LoadedReranker:
  """A trained reranker with its hyperparameters and the record of what it was trained on."""

  source: str  # the workdir or file it came from
  params: dict
  spec: core.CoreSpec
  hparams: core.HParams
  record: dict
  step: int | None = None  # the training step of these weights
  planned_steps: int | None = None  # the steps its workdir's run was set to reach


def _nest(flat: dict[str, np.ndarray]) -> dict:
  """{"q_mlp/w1": x} -> {"q_mlp": {"w1": x}} (the inverse of export.flatten_params)."""
  out: dict = {}
  for name, value in flat.items():
    *parents, leaf = name.split("/")
    node = out
    for p in parents:
      node = node.setdefault(p, {})
    node[leaf] = jnp.asarray(value)
  return out


def load_reranker(path: Path) -> LoadedReranker:
  """A trained reranker from a training workdir or an exported .safetensors file."""
  path = Path(path)
  refuse_unless(path, "--reranker", ("reranker", "reranker file", "both"))
  if path.is_dir():
    record = read_record(path)
    params, cfg, step = load_trained_params(path)
    return LoadedReranker(str(path), params, cfg.core_spec(), cfg.hparams(), record, step,
                          cfg.steps)
  if path.suffix != ".safetensors":
    raise ValueError(f"--reranker {path}: expected a training workdir or an exported "
                     ".safetensors file")
  weights, meta = read_reranker(path)
  spec = core.CoreSpec(variant=meta["variant"], dim=int(meta["dim"]), k=int(meta["k"]),
                       m=int(meta["m"]), batch=int(meta["batch"]),
                       hidden=int(meta.get("hidden") or 256), rank_prior=bool(meta["rank_prior"]))
  return LoadedReranker(str(path), _nest(weights), spec, core.HParams.create(**meta["hparams"]),
                        meta["record"], meta.get("step"))
