"""`rmmjax bench search` and `rmmjax bench encode`: retrieval-side throughput against references.

search: top-20 over 1,000,000 memories (D = 384) for batches of 64 queries, the jitted JAX
matmul + top-k against FAISS flat inner-product search when it is installed, else NumPy, in one
run. A batch does 2 x 64 x 384 x 1e6 = 49 GFLOP over a 1.5 GB bank: compute-bound on a CPU.
encode: sentences/s of the Flax encoder against sentence-transformers on the same LoCoMo turns.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from rmmjax.bench.core import median_time
from rmmjax.retrieve.dense import dense_top_k

N, D, BATCH, K = 1_000_000, 384, 64, 20


def _write(result: dict, out: Path | None) -> None:
  if out is not None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {out}")


def bench_search(out: Path | None, quick: bool = False) -> dict:
  n = 100_000 if quick else N
  repeats = 3 if quick else 5
  rng = np.random.default_rng(0)
  bank = rng.standard_normal((n, D), dtype=np.float32)
  bank /= np.linalg.norm(bank, axis=1, keepdims=True)
  queries = rng.standard_normal((BATCH, D), dtype=np.float32)
  queries /= np.linalg.norm(queries, axis=1, keepdims=True)

  bank_dev = jnp.asarray(bank)
  q_dev = jnp.asarray(queries)
  jax_run = lambda: jax.block_until_ready(dense_top_k(q_dev, bank_dev, K))  # noqa: E731
  jax_idx = np.asarray(jax_run()[1])
  rows = [{"method": "jax (jit matmul + top_k)", "seconds": median_time(jax_run, repeats)}]
  try:
    import faiss  # noqa: PLC0415  (optional reference)
    index = faiss.IndexFlatIP(D)
    index.add(bank)
    ref_run = lambda: index.search(queries, K)  # noqa: E731
    ref_name = f"faiss {faiss.__version__} IndexFlatIP"
  except ImportError:
    def ref_run():
      scores = queries @ bank.T
      part = np.argpartition(-scores, K, axis=1)[:, :K]
      order = np.argsort(-np.take_along_axis(scores, part, 1), axis=1)
      return None, np.take_along_axis(part, order, 1)
    ref_name = "numpy (matmul + argpartition)"
  ref_idx = np.asarray(ref_run()[1])
  rows.append({"method": ref_name, "seconds": median_time(ref_run, repeats)})
  agreement = float(np.mean([len(set(a) & set(b)) / K for a, b in zip(jax_idx, ref_idx)]))
  flops = 2.0 * BATCH * D * n
  for row in rows:
    row["queries_per_s"] = BATCH / row["seconds"]
    row["gflop_per_s"] = flops / row["seconds"] / 1e9
  result = {"memories": n, "dim": D, "batch": BATCH, "k": K, "top_k_agreement": agreement,
            "rows": rows}
  print(f"top-{K} over {n:,} memories (D={D}), batches of {BATCH} queries; median of {repeats}")
  print(f"{'method':36s}{'ms/batch':>10s}{'queries/s':>12s}{'GFLOP/s':>10s}")
  for row in rows:
    print(f"{row['method']:36s}{row['seconds'] * 1e3:10.1f}{row['queries_per_s']:12.0f}"
          f"{row['gflop_per_s']:10.1f}")
  print(f"JAX / reference time: {rows[0]['seconds'] / rows[1]['seconds']:.2f}; "
        f"top-{K} agreement {agreement:.4f}")
  _write(result, out)
  return result


def bench_encode(out: Path | None, data: Path, quick: bool = False) -> dict:
  from rmmjax.data.locomo import load_locomo  # noqa: PLC0415
  from rmmjax.encode.encoder import SentenceEncoder  # noqa: PLC0415
  from rmmjax.retrieve.units import build_units  # noqa: PLC0415

  conversations, _ = load_locomo(data)
  texts = [u.text for c in conversations for u in build_units(c, "turn")][:200 if quick else 1000]
  ours = SentenceEncoder(batch_size=64)
  ours.encode(texts)  # compile every bucket shape first
  rows = [{"method": "rmmjax Flax encoder", "seconds": median_time(lambda: ours.encode(texts), 3)}]
  try:
    from sentence_transformers import SentenceTransformer  # noqa: PLC0415
  except ImportError:
    print("sentence-transformers is not installed: pip install -e '.[parity]' for the reference")
  else:
    reference = SentenceTransformer(str(ours.model_dir), device="cpu")
    reference.encode(texts[:64])
    rows.append({"method": "sentence-transformers (PyTorch)", "seconds": median_time(
        lambda: reference.encode(texts, batch_size=64, show_progress_bar=False), 3)})
  for row in rows:
    row["sentences_per_s"] = len(texts) / row["seconds"]
  result = {"sentences": len(texts), "model": ours.identity, "rows": rows}
  print(f"{len(texts)} LoCoMo turns, batch 64; median of 3")
  for row in rows:
    print(f"{row['method']:36s}{row['sentences_per_s']:10.1f} sentences/s")
  if len(rows) == 2:
    print(f"Flax / PyTorch speed: {rows[0]['sentences_per_s'] / rows[1]['sentences_per_s']:.2f}")
  _write(result, out)
  return result
