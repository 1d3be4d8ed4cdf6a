"""`rmmjax bench cross`: the cross reranker's scoring, training and serving speed against
sentence-transformers' CrossEncoder. The method: docs/benchmarks.md, "The cross reranker"."""

from __future__ import annotations

import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from rmmjax import core
from rmmjax.learners.cross import CrossModel, cross_scores
from rmmjax.learners.cross.task import cross_initial_params
from rmmjax.bench.core import median_time, timed, write_result
from rmmjax.bench.machine import describe, machine_info

MAX_LENGTH, QUESTIONS = 128, 4
SCORE_K, TRAIN_K = 20, 8
# Served: one question at a time, as the agent and `eval` read it, over the default K over turns
# and over the 20 a cheaper first stage would leave it.
SERVED_K = (50, 20)


def _pairs(data: Path, batches: int, k: int) -> list[tuple[list[str], list[list[str]]]]:
  from rmmjax.data.locomo import load_locomo
  from rmmjax.retrieve.units import build_units
  conversations, _ = load_locomo(data)
  rng = np.random.default_rng(0)
  out = []
  for b in range(batches):
    conv = conversations[b % len(conversations)]
    texts = [u.text for u in build_units(conv, "turn")]
    qs = [q.question for q in conv.questions]
    picks = rng.choice(len(qs), QUESTIONS, replace=False)
    out.append(([qs[i] for i in picks],
                [[texts[j] for j in rng.choice(len(texts), k, replace=False)] for _ in picks]))
  return out


def compiled_flops(fn, *args) -> float:
  """The FLOPs XLA counts in fn's compiled program for these arguments (0 where it counts none)."""
  cost = fn.lower(*args).compile().cost_analysis()
  cost = cost[0] if isinstance(cost, list | tuple) else cost
  return float((cost or {}).get("flops", 0.0))


def matmul_rate(dtype=jnp.float32, repeats: int = 5) -> float:
  """FLOPs per second of one large square matmul on the default device: the practical peak
  that a compute-bound program is measured against."""
  n = 2048 if jax.default_backend() == "cpu" else 8192
  a = jax.device_put(jnp.ones((n, n), dtype))
  matmul = jax.jit(jnp.matmul)
  matmul(a, a).block_until_ready()
  return 2.0 * n ** 3 / median_time(lambda: matmul(a, a).block_until_ready(), repeats)


def bench_cross(out: Path | None, data: Path, quick: bool = False) -> dict:
  from rmmjax.encode.encoder import SentenceEncoder, compiler_options
  from rmmjax.learners.cross.export import export_cross
  from rmmjax.learners.cross.pairs import pack_batch, pair_tokens

  encoder = SentenceEncoder()
  cfg = encoder.cfg
  params = _params(encoder, SCORE_K)
  repeats = 2 if quick else 5
  batches = 2 if quick else 4
  score_sets = _pairs(data, batches, SCORE_K)
  train_sets = _pairs(data, batches, TRAIN_K)

  score = jax.jit(lambda p, pairs: cross_scores(p, pairs, cfg),
                  compiler_options=compiler_options())
  spec = core.CoreSpec(variant="cross", dim=cfg.hidden_size, k=TRAIN_K, m=2, batch=QUESTIONS,
                       model=CrossModel(cfg))
  relevant = np.zeros((QUESTIONS, TRAIN_K), bool)
  relevant[:, 0] = True
  train_params = dict(params, rank_bias=params["rank_bias"][:TRAIN_K])
  step = jax.jit(core.supervised_step, compiler_options=compiler_options())

  def batch_of(qs, texts, k):
    return pack_batch(core.Batch(
        q_BxD=np.zeros((QUESTIONS, cfg.hidden_size), np.float32),
        mem_BxKxD=np.zeros((QUESTIONS, k, cfg.hidden_size), np.float32),
        mask_BxK=np.ones((QUESTIONS, k), bool),  # labels for training only; scoring reads none
        relevant_BxK=relevant if k == TRAIN_K else None,
        num_relevant_B=np.ones(QUESTIONS, np.int32) if k == TRAIN_K else None,
        inputs=pair_tokens(encoder.tokenizer, qs, texts, MAX_LENGTH).candidates()))

  score_batches = [batch_of(*s, SCORE_K) for s in score_sets]
  train_batches = [batch_of(*s, TRAIN_K) for s in train_sets]

  def ours_score():
    for batch in score_batches:
      score(params, batch.inputs).block_until_ready()

  box = [core.init_state(spec, core.HParams.create(lr=2e-5, tau=1.0), train_params)]

  def ours_train():
    for batch in train_batches:
      box[0] = jax.block_until_ready(step(box[0], batch)[0])

  served = {k: _served_ms(encoder, data, k, 4 if quick else 8) for k in SERVED_K}
  ours_score(), ours_train()  # compile every length first
  score_pairs = batches * QUESTIONS * SCORE_K
  train_pairs = batches * QUESTIONS * TRAIN_K
  packed = [b.inputs for b in score_batches + train_batches]
  real = sum(int((p.slots_RxL > 0).sum()) for p in packed) / sum(p.ids_RxL.size for p in packed)
  shapes = sorted({p.ids_RxL.shape for p in packed})
  score_s, train_s = median_time(ours_score, repeats), median_time(ours_train, repeats)
  score_flops = sum(compiled_flops(score, params, b.inputs) for b in score_batches)
  train_flops = sum(compiled_flops(step, box[0], b) for b in train_batches)
  real_tokens = lambda bs: sum(int((b.inputs.slots_RxL > 0).sum()) for b in bs)  # noqa: E731
  peak = matmul_rate()
  rows = [{"method": "rmmjax (JAX, float32)", "lengths": [list(x) for x in shapes],
           "real_positions": real,
           "score_pairs_per_s": score_pairs / score_s, "train_pairs_per_s": train_pairs / train_s,
           "score_tokens_per_s": real_tokens(score_batches) / score_s,
           "train_tokens_per_s": real_tokens(train_batches) / train_s,
           "score_flop_per_s": score_flops / score_s, "train_flop_per_s": train_flops / train_s,
           "matmul_flop_per_s": peak,
           "served_ms_per_question": {k: ms for k, (ms, _) in served.items()}}]
  try:
    import torch
    from sentence_transformers import CrossEncoder
  except ImportError:
    print("sentence-transformers is not installed: pip install -e '.[parity]' for the reference")
  else:
    rows.append(_reference(torch, CrossEncoder, params, cfg, encoder, score_sets, train_sets,
                           repeats, score_pairs, train_pairs, export_cross,
                           {k: sets for k, (_, sets) in served.items()}))
  result = {"machine": machine_info(), "max_length": MAX_LENGTH, "repeats": repeats,
            "score_batch": f"{QUESTIONS} x {SCORE_K}", "train_batch": f"{QUESTIONS} x {TRAIN_K}",
            "rows": rows}
  print(f"cross reranker on {describe(result['machine'])}: {score_pairs} scoring pairs in "
        f"batches of {QUESTIONS} x {SCORE_K}, {train_pairs} training pairs in batches of "
        f"{QUESTIONS} x {TRAIN_K}, median of {repeats}")
  print(f"{'':34s}{'score pairs/s':>15s}{'train pairs/s':>15s}{'real positions':>16s}"
        "  shapes (rows x length, or lengths)")
  for row in rows:
    print(f"{row['method']:34s}{row['score_pairs_per_s']:15.1f}{row['train_pairs_per_s']:15.1f}"
          f"{row['real_positions']:16.0%}  {row['lengths']}")
  ours = rows[0]
  print(f"rmmjax real tokens/s: scoring {ours['score_tokens_per_s']:,.0f}, training "
        f"{ours['train_tokens_per_s']:,.0f}; XLA-counted GFLOP/s: scoring "
        f"{ours['score_flop_per_s'] / 1e9:,.1f}, training {ours['train_flop_per_s'] / 1e9:,.1f}, "
        f"that is {ours['score_flop_per_s'] / peak:.0%} and {ours['train_flop_per_s'] / peak:.0%} "
        f"of a large float32 matmul's {peak / 1e9:,.1f} GFLOP/s on this device")
  for row in rows:
    print(f"served, ms per question, {row['method']}: " + ", ".join(
        f"K = {k} {ms:.0f}" for k, ms in row["served_ms_per_question"].items()))
  if len(rows) == 2:
    result["score_ratio"] = rows[0]["score_pairs_per_s"] / rows[1]["score_pairs_per_s"]
    result["train_ratio"] = rows[0]["train_pairs_per_s"] / rows[1]["train_pairs_per_s"]
    # The reference always runs on the CPU: beside an accelerator the ratio compares devices.
    backend = result["machine"]["backend"]
    versus = ("PyTorch" if backend == "cpu" else
              f"PyTorch on the CPU (rmmjax on the {backend}: devices, not code)")
    print(f"rmmjax / {versus}: scoring {result['score_ratio']:.2f}, training "
          f"{result['train_ratio']:.2f} (torch {rows[1]['torch']}, {rows[1]['torch_threads']} "
          "threads)")
  write_result(result, out)
  return result


def _params(encoder, k: int) -> dict:
  """Cross parameters over K candidates with a head away from zero, so both sides compute
  every layer of the score."""
  params = cross_initial_params(encoder, k, 1.0)
  params["encoder"]["classifier"]["kernel"] = jnp.full((encoder.dim, 1), 0.01, jnp.float32)
  return params


def _served_ms(encoder, data: Path, k: int, questions: int):
  """Median milliseconds per question from texts to scores, as a trained reranker serves, and
  the (question, texts) it read."""
  from rmmjax.learners.cross.reader import CrossReader
  reader = CrossReader(encoder.tokenizer, MAX_LENGTH, "bench")
  params = _params(encoder, k)
  cfg = encoder.cfg
  score = jax.jit(lambda p, pairs: cross_scores(p, pairs, cfg),
                  compiler_options=reader.compiler_options())
  sets = [(qs[0], texts[0]) for qs, texts in _pairs(data, questions, k)]

  def serve(question, texts_K):
    arrays = reader.candidate_arrays(question, texts_K)
    batch = reader.pack(core.Batch(
        q_BxD=np.zeros((1, cfg.hidden_size), np.float32),
        mem_BxKxD=np.zeros((1, k, cfg.hidden_size), np.float32), mask_BxK=np.ones((1, k), bool),
        inputs=reader.inputs(tuple(x[None] for x in arrays))))
    return np.asarray(score(params, batch.inputs))

  for question, texts in sets:  # compile every packed shape first
    serve(question, texts)
  return _median_ms(serve, sets), sets


def _median_ms(fn, sets) -> float:
  """Median milliseconds of fn(question, texts) over the (question, texts) of `sets`."""
  return 1e3 * float(np.median([timed(lambda q=q, t=t: fn(q, t)) for q, t in sets]))


def _reference(torch, CrossEncoder, params, cfg, encoder, score_sets, train_sets, repeats,
               score_pairs, train_pairs, export_cross, served_sets: dict) -> dict:
  """The same pairs through sentence-transformers' CrossEncoder of the same weights, and the
  same questions served (`served_sets`: K -> (question, texts))."""
  with tempfile.TemporaryDirectory() as tmp:
    served = export_cross(jax.device_get(params), cfg, encoder.model_dir, Path(tmp) / "cross",
                          {}, MAX_LENGTH)
    model = CrossEncoder(str(served), device="cpu", max_length=MAX_LENGTH)
  flat = [[(q, t) for q, row in zip(qs, texts) for t in row] for qs, texts in score_sets]
  predict = lambda q, texts: model.predict([(q, t) for t in texts], batch_size=len(texts),  # noqa: E731
                                           show_progress_bar=False)  # one question a batch
  served = {}
  for k, sets in served_sets.items():
    predict(*sets[0])  # (its shapes warmed untimed)
    served[k] = _median_ms(predict, sets)

  def theirs_score():
    for pairs in flat:
      model.predict(pairs, batch_size=len(pairs), show_progress_bar=False)

  net = model.model
  optimizer = torch.optim.Adam(net.parameters(), lr=2e-5)
  features = []
  for qs, texts in train_sets:
    pairs = [(q, t) for q, row in zip(qs, texts) for t in row]
    features.append(model.tokenizer([p[0] for p in pairs], [p[1] for p in pairs], padding=True,
                                    truncation="longest_first", max_length=MAX_LENGTH,
                                    return_tensors="pt"))
  target = torch.zeros(QUESTIONS, dtype=torch.long)

  def theirs_train():  # in eval mode: no dropout, the function rmmjax trains
    for f in features:
      logits = net(**f).logits.view(QUESTIONS, TRAIN_K)
      loss = torch.nn.functional.cross_entropy(logits, target)
      optimizer.zero_grad()
      loss.backward()
      optimizer.step()

  theirs_score(), theirs_train()
  lengths = sorted({int(f["input_ids"].shape[1]) for f in features})
  real = (sum(int(f["attention_mask"].sum()) for f in features)
          / sum(f["attention_mask"].numel() for f in features))
  return {"method": "sentence-transformers CrossEncoder", "lengths": lengths,
          "real_positions": real,
          "score_pairs_per_s": score_pairs / median_time(theirs_score, repeats),
          "train_pairs_per_s": train_pairs / median_time(theirs_train, repeats),
          "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
          "served_ms_per_question": served}
