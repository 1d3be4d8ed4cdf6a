"""Export a trained reranker for serving: safetensors weights plus a JSON of what a server needs."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import jax
import numpy as np
from safetensors.numpy import save_file

from rmmjax import core
from rmmjax.io.checkpoint import Checkpointer
from rmmjax.io.workdir import atomic_write_json, read_config

FORMAT_VERSION = 1
SCORE_FORMULAS = {  # embeddings are row vectors; weights multiply them on the right
    "linear": "s_i = (q + q wq) . (m_i + m_i wm)",
    "mlp": "s_i = (q + f_q(q)) . (m_i + f_m(m_i)), f(x) = gelu(x w1 + b1) w2 (+ b2, query only)",
}
RANK_PRIOR_FORMULA = " + rank_bias[i], i the candidate's position in the base retriever's order"


def flatten_params(params: dict, prefix: str = "") -> dict[str, np.ndarray]:
  """{"q_mlp": {"w1": x}} -> {"q_mlp/w1": x} (names as a serving system sees them)."""
  flat = {}
  for name, value in params.items():
    if isinstance(value, dict):
      flat.update(flatten_params(value, f"{prefix}{name}/"))
    else:
      flat[f"{prefix}{name}"] = np.ascontiguousarray(np.asarray(value, np.float32))
  return flat


def load_trained_params(workdir: Path) -> tuple[dict, "object"]:
  """The newest checkpointed parameters of a training workdir, with its config."""
  cfg = read_config(workdir)
  checkpointer = Checkpointer(Path(workdir) / "checkpoints")
  try:
    step = checkpointer.latest_step()
    if step is None:
      raise FileNotFoundError(f"{workdir}/checkpoints holds no checkpoint to export")
    template = core.init_state(cfg.core_spec(), cfg.hparams())
    state = checkpointer.restore(step, template)
  finally:
    checkpointer.close()
  return jax.device_get(state.params), cfg, step


def export_reranker(workdir: Path, out: Path) -> dict:
  """Writes OUT (.safetensors) and OUT with .json; returns the metadata written."""
  out = Path(out)
  if out.suffix != ".safetensors":
    raise ValueError(f"--out {out}: expected a file name ending in .safetensors")
  params, cfg, step = load_trained_params(workdir)
  meta = {"format_version": FORMAT_VERSION, "variant": cfg.variant, "dim": cfg.dim,
          "hidden": cfg.hidden if cfg.variant == "mlp" else None, "tau": cfg.tau, "k": cfg.k,
          "m": cfg.m, "encoder": cfg.encoder, "step": step,
          "score": SCORE_FORMULAS[cfg.variant] + (RANK_PRIOR_FORMULA if cfg.rank_prior else ""),
          "online": {"baseline": cfg.baseline, "baseline_kind": cfg.baseline_kind,
                     "lr": cfg.lr, "p_rel": cfg.p_rel, "p_irr": cfg.p_irr},
          "selection": "serve the top m by score; sample with Gumbel noise on score / tau"}
  out.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
  os.close(fd)
  try:
    save_file(flatten_params(params), tmp,
              metadata={k: json.dumps(v) for k, v in meta.items()})
    os.replace(tmp, out)
  except BaseException:
    Path(tmp).unlink(missing_ok=True)
    raise
  atomic_write_json(out.with_suffix(".json"), meta)
  return meta
