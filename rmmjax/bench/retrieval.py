"""`rmmjax bench search` and `rmmjax bench encode`. The method: docs/benchmarks.md, "Retrieval
benchmarks"."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from rmmjax.bench.core import median_time, write_result
from rmmjax.retrieve.dense import dense_top_k

N, D, BATCH, K = 1_000_000, 384, 64, 20


def bench_search(out: Path | None, quick: bool = False) -> dict:
  n = 100_000 if quick else N
  repeats = 3 if quick else 5
  rng = np.random.default_rng(0)
  bank, queries = (rng.standard_normal((rows, D), dtype=np.float32) for rows in (n, BATCH))
  bank /= np.linalg.norm(bank, axis=1, keepdims=True)
  queries /= np.linalg.norm(queries, axis=1, keepdims=True)
  bank_dev, q_dev = jnp.asarray(bank), jnp.asarray(queries)
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
  write_result(result, out)
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
    import torch  # noqa: PLC0415  (installed with sentence-transformers)
    reference = SentenceTransformer(str(ours.model_dir), device="cpu")
    reference.encode(texts[:64])
    rows.append({"method": "sentence-transformers (PyTorch)", "seconds": median_time(
        lambda: reference.encode(texts, batch_size=64, show_progress_bar=False), 3),
                 "torch": torch.__version__, "torch_threads": torch.get_num_threads()})
  for row in rows:
    row["sentences_per_s"] = len(texts) / row["seconds"]
  training = bench_encoder_training(ours, texts, repeats=3 if quick else 5)
  result = {"sentences": len(texts), "model": ours.identity, "rows": rows, "training": training}
  print(f"{len(texts)} LoCoMo turns, batch 64; median of 3")
  for row in rows:
    print(f"{row['method']:36s}{row['sentences_per_s']:10.1f} sentences/s")
  if len(rows) == 2:
    print(f"Flax / PyTorch speed: {rows[0]['sentences_per_s'] / rows[1]['sentences_per_s']:.2f} "
          f"(torch {rows[1]['torch']}, {rows[1]['torch_threads']} threads)")
  print(f"\nquery-encoder training (forward and backward through MiniLM, K={K} candidates; "
        f"median of {training[0]['repeats']})")
  for row in training:
    print(f"{row['method']:36s}{row['questions_per_s']:10.1f} questions/s")
  write_result(result, out)
  return result


def bench_encoder_training(encoder, texts: list[str], repeats: int) -> list[dict]:
  """Questions/s of the query encoder's supervised step (batch 16) and REINFORCE step (batch 4)
  on LoCoMo turns as questions, K random candidate embeddings each."""
  from rmmjax import core  # noqa: PLC0415
  from rmmjax.encode.tuned import encoder_state  # noqa: PLC0415
  from rmmjax.learners.query_encoder.fit import encoder_scorer, pad_tokens  # noqa: PLC0415

  rng = np.random.default_rng(0)
  rows = []
  for name, batch in (("supervised step", 16), ("REINFORCE step", 4)):
    ids_BxT, mask_BxT = pad_tokens(encoder, texts[:batch], encoder.max_length)
    mem = rng.standard_normal((batch, K, encoder.dim)).astype(np.float32)
    data = core.Batch(q_BxD=np.zeros((batch, encoder.dim), np.float32),
                      mem_BxKxD=mem / np.linalg.norm(mem, axis=-1, keepdims=True),
                      mask_BxK=np.ones((batch, K), bool), relevant_BxK=np.eye(batch, K, dtype=bool),
                      num_relevant_B=np.ones(batch, np.int32))
    spec = core.CoreSpec(dim=encoder.dim, k=K, m=5, batch=batch)
    scorer = encoder_scorer(encoder.module, ids_BxT, mask_BxT)
    if batch == 16:
      step = jax.jit(lambda s, b, sc=scorer: core.supervised_step(s, b, sc), donate_argnums=0)
    else:
      key = jax.random.PRNGKey(0)
      step = jax.jit(lambda s, b, sc=scorer, k=key: core.train_step(s, b, k, sc),
                     donate_argnums=0)
    box = [encoder_state(encoder, spec, core.HParams.create(lr=1e-5))]

    def run(step=step, box=box, data=data):
      box[0] = jax.block_until_ready(step(box[0], data)[0])

    run()  # compile
    seconds = median_time(run, repeats)
    rows.append({"method": f"{name}, batch {batch} ({ids_BxT.shape[1]} tokens)", "seconds": seconds,
                 "questions_per_s": batch / seconds, "repeats": repeats})
  return rows
