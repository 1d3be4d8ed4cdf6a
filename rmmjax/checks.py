"""Host-side checks of data entering the core: shapes and finite values, with clear messages.

They run on concrete arrays before anything is compiled (inside jit a NaN cannot be refused).
NumPy only, so the serving path can use them without JAX.
"""

from __future__ import annotations

import numpy as np


def check_embeddings(x, name: str, dim: int, ndim: int) -> np.ndarray:
  """Returns x as float32, refusing a wrong shape or non-finite values."""
  x = np.asarray(x, np.float32)
  if x.ndim != ndim or x.shape[-1] != dim:
    want = {1: "(D,)", 2: "(K, D)", 3: "(B, K, D)"}.get(ndim, f"{ndim} axes")
    if ndim == 2 and name.startswith("q"):
      want = "(B, D)"
    raise ValueError(f"{name} has shape {x.shape}; expected {want} with D={dim}")
  bad = ~np.isfinite(x)
  if bad.any():
    raise ValueError(f"{name} holds {int(bad.sum())} NaN or infinite values "
                     f"(first at index {tuple(int(i) for i in np.argwhere(bad)[0])})")
  return x


def check_batch(batch, dim: int, k: int) -> None:
  """Refuses a core.Batch whose arrays disagree with each other or with (dim, k)."""
  q = check_embeddings(batch.q_BxD, "q_BxD", dim, 2)
  mem = check_embeddings(batch.mem_BxKxD, "mem_BxKxD", dim, 3)
  b = q.shape[0]
  if mem.shape[:2] != (b, k):
    raise ValueError(f"mem_BxKxD has shape {mem.shape}; expected ({b}, {k}, {dim})")
  for name in ("mask_BxK", "relevant_BxK"):
    arr = np.asarray(getattr(batch, name))
    if arr.shape != (b, k) or arr.dtype != np.bool_:
      raise ValueError(f"{name} has shape {arr.shape} and dtype {arr.dtype}; expected bool "
                       f"({b}, {k})")
  num = np.asarray(batch.num_relevant_B)
  if num.shape != (b,):
    raise ValueError(f"num_relevant_B has shape {num.shape}; expected ({b},)")
