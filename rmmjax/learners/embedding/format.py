"""The exported reranker file: safetensors weights whose header carries everything needed to
serve, evaluate or keep training it (FILE.json beside it is a readable copy). NumPy and
safetensors only, so a server can read it without JAX."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open

from rmmjax.io.manifest import another_version

FORMAT_VERSION = 2
HEADER_KEY = "rmmjax"  # the header's metadata entry holding the JSON description
SCORE_FORMULAS = {  # embeddings are row vectors; weights multiply them on the right
    "linear": "s_i = (q + q wq) . (m_i + m_i wm)",
    "mlp": "s_i = (q + f_q(q)) . (m_i + f_m(m_i)), f(x) = gelu(x w1 + b1) w2 (+ b2, query only)",
}
RANK_PRIOR_FORMULA = (" + rank_bias[i], i the candidate's position in the order it came in (the "
                      "base retriever's; IRIS's final order for units lace); fewer than k "
                      "candidates take the first biases")


def check_weights(weights: dict[str, np.ndarray], meta: dict, where: str) -> None:
  """Refuses missing, extra, misshapen or non-finite weights."""
  d, k = int(meta["dim"]), int(meta["k"])
  if meta["variant"] == "linear":
    want = {"wq": (d, d), "wm": (d, d)}
  elif meta["variant"] == "mlp":
    h = int(meta["hidden"])
    want = {f"{side}/{name}": shape for side in ("q_mlp", "m_mlp")
            for name, shape in (("w1", (d, h)), ("b1", (h,)), ("w2", (h, d)))}
    want["q_mlp/b2"] = (d,)
  else:
    raise ValueError(f"variant {meta['variant']!r} is not one of {', '.join(SCORE_FORMULAS)}")
  if meta.get("rank_prior"):
    want["rank_bias"] = (k,)
  if set(weights) != set(want):
    raise ValueError(f"{where}: holds weights {sorted(weights)}, but a {meta['variant']} "
                     f"reranker of dim {meta['dim']} has {sorted(want)}")
  for name, shape in want.items():
    if tuple(weights[name].shape) != shape:
      raise ValueError(f"{where}: weight {name} has shape {tuple(weights[name].shape)}; "
                       f"expected {shape}")
    bad = int(np.sum(~np.isfinite(weights[name])))
    if bad:
      raise ValueError(f"{where}: weight {name} holds {bad} NaN or infinite values; the file "
                       "cannot score anything")


def read_reranker(path: str | Path) -> tuple[dict[str, np.ndarray], dict]:
  """(weights, description) of an exported reranker, checked."""
  path = Path(path)
  if path.is_dir():
    raise ValueError(f"{path} is a directory; expected an exported .safetensors file (or pass "
                     "a training workdir where a workdir is accepted)")
  if not path.exists():
    raise FileNotFoundError(f"{path} does not exist (expected a file written by rmmjax export)")
  try:
    with safe_open(str(path), framework="numpy") as f:
      header = f.metadata() or {}
      weights = {name: f.get_tensor(name) for name in f.keys()}
  except (SafetensorError, OSError, ValueError) as err:
    raise ValueError(f"{path}: not a readable safetensors file ({err}); it may be truncated: "
                     "export it again") from None
  if HEADER_KEY not in header:
    raise ValueError(f"{path}: the safetensors header has no {HEADER_KEY!r} entry; expected a "
                     f"reranker written by rmmjax export (format {FORMAT_VERSION})")
  try:
    meta = json.loads(header[HEADER_KEY])
  except json.JSONDecodeError:
    raise ValueError(f"{path}: the header's {HEADER_KEY!r} entry is not JSON") from None
  if meta.get("format_version") != FORMAT_VERSION:
    raise another_version(str(path), f"reranker format {meta.get('format_version')!r}",
                          f"reranker format {FORMAT_VERSION}", "export it again")
  check_weights(weights, meta, str(path))
  return weights, meta
