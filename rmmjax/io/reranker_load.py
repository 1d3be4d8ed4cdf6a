"""Loading a trained reranker for evaluation or serving: from a training workdir (its newest
readable checkpoint, config and record) or from an exported .safetensors file (its header)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from rmmjax import core
from rmmjax.encode.protocol import encoder_identity, require_bert, tokenizer_identity
from rmmjax.io.export import load_trained_params, read_record, trained_spec
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


RERANKER_KINDS = ("reranker", "reranker file", "both")  # what --reranker takes (io.kinds)


def reranker_record(path: Path) -> dict:
  """What a reranker (a workdir or an exported file) was trained on, without its weights."""
  path = Path(path)
  refuse_unless(path, "--reranker", RERANKER_KINDS)
  if path.is_dir():
    return read_record(path)
  return load_reranker(path).record


def load_reranker(path: Path) -> LoadedReranker:
  """A trained reranker from a training workdir or an exported .safetensors file."""
  path = Path(path)
  refuse_unless(path, "--reranker", RERANKER_KINDS)
  if path.is_dir():
    record = read_record(path)
    params, cfg, step = load_trained_params(path)
    return LoadedReranker(str(path), params, trained_spec(cfg, path), cfg.hparams(), record,
                          step, cfg.steps)
  if path.suffix != ".safetensors":
    raise ValueError(f"--reranker {path}: expected a training workdir or an exported "
                     ".safetensors file")
  weights, meta = read_reranker(path)
  spec = core.CoreSpec(variant=meta["variant"], dim=int(meta["dim"]), k=int(meta["k"]),
                       m=int(meta["m"]), batch=int(meta["batch"]),
                       hidden=int(meta.get("hidden") or 256), rank_prior=bool(meta["rank_prior"]))
  return LoadedReranker(str(path), _nest(weights), spec, core.HParams.create(**meta["hparams"]),
                        meta["record"], meta.get("step"))


def check_cross_encoder(reranker: LoadedReranker, encoder) -> None:
  """Refuses a cross reranker beside an encoder or tokenizer other than the ones it trained
  with, naming both."""
  require_bert(encoder, f"the cross reranker {reranker.source}")
  trained, here = reranker.record.get("encoder"), encoder_identity(encoder)
  if trained != here:
    raise ValueError(f"the cross reranker {reranker.source} was trained beside the encoder "
                     f"{trained}; this one is {here}")
  trained, here = reranker.record["cross"]["tokenizer"], tokenizer_identity(encoder)
  if trained != here:
    raise ValueError(f"the cross reranker {reranker.source} reads pairs cut by the tokenizer "
                     f"with sha256 {trained[:12]}; this encoder's tokenizer is {here[:12]}")
