"""`rmmjax bench core`: training-step throughput (the fast linear scorer beside the naive
formulation, alternated within each repeat) and sweep throughput against the memory-bandwidth
limit measured in the same run. The method and its counts: docs/benchmarks.md."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from rmmjax import core
from rmmjax.bench.machine import describe, machine_info
from rmmjax.learners.embedding.model import EMBEDDING
from rmmjax.train.sweep.chunks import run_chunks  # the chunk driver `rmmjax sweep` uses

D, K, M = 384, 20, 5
TRAIN_BATCHES = (4, 64, 1024)
SWEEP_CONFIGS, SWEEP_STEPS, SWEEP_BATCH = 64, 200, 4
BYTES_F32 = 4


def timed(fn) -> float:
  """Wall time of one call of fn, in seconds."""
  t0 = time.perf_counter()
  fn()
  return time.perf_counter() - t0


def median_time(fn, repeats: int) -> float:
  return float(np.median([timed(fn) for _ in range(repeats)]))


def percentiles_ms(times: dict[str, list[float]], qs=(50, 95)) -> dict[str, float]:
  """{"<name>_p<q>_ms": the q-th percentile of times[name] (seconds), in milliseconds}."""
  return {f"{name}_p{q}_ms": 1e3 * float(np.percentile(seconds, q))
          for name, seconds in times.items() for q in qs}


def write_result(result: dict, out: Path | None) -> None:
  """Names the machine under the table and in the result; the result as JSON at `out`."""
  result["machine"] = machine_info()
  print(f"\nmachine: {describe(result['machine'])}")
  if out is not None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {out}")


def measure_bandwidth(megabytes: int = 256, repeats: int = 15) -> float:
  """Bytes/s of x <- a * x over an array far larger than the caches, donated so no time goes to
  page faults of fresh output buffers; the median repeat (docs/benchmarks.md says why)."""
  n = megabytes * 2**20 // BYTES_F32
  scale = jax.jit(lambda x: x * 1.0001, donate_argnums=0)
  box = [scale(jnp.ones((n,), jnp.float32)).block_until_ready()]

  def once():
    box[0] = scale(box[0]).block_until_ready()

  return 2 * n * BYTES_F32 / median_time(once, repeats)


def _random_batch(batch: int) -> core.Batch:
  kq, km, kr = jax.random.split(jax.random.PRNGKey(0), 3)
  unit = lambda x: x / jnp.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
  return core.Batch(q_BxD=unit(jax.random.normal(kq, (batch, D))),
                    mem_BxKxD=unit(jax.random.normal(km, (batch, K, D))),
                    mask_BxK=jnp.ones((batch, K), bool),
                    relevant_BxK=jax.random.uniform(kr, (batch, K)) < 0.15,
                    num_relevant_B=jnp.full((batch,), 3, jnp.int32))


def bench_train(repeats: int, min_seconds: float, bar) -> list[dict]:
  results = []
  for batch in TRAIN_BATCHES:
    bar.set_description(f"train_step, batch {batch}")
    data = _random_batch(batch)
    runners = {}
    for formulation in ("fast", "naive"):
      spec = core.CoreSpec(dim=D, k=K, m=M, batch=batch, formulation=formulation,
                           model=EMBEDDING)
      step = jax.jit(core.train_step, donate_argnums=0)
      box = {"state": core.init_state(spec, core.HParams.create())}
      key = jax.random.PRNGKey(1)

      def run(n, step=step, box=box, key=key, data=data):
        state = box["state"]
        for _ in range(n):
          state, _ = step(state, data, key)
        box["state"] = jax.block_until_ready(state)

      run(3)  # compile and warm up
      per_step = max(timed(lambda run=run: run(3)) / 3, 1e-6)
      runners[formulation] = (run, max(3, int(min_seconds / per_step)))
    times = {f: [] for f in runners}
    for _ in range(repeats):  # alternate so both formulations see the same machine state
      for f, (run, n) in runners.items():
        times[f].append(timed(lambda run=run, n=n: run(n)) / n)
    for f in runners:
      results.append({"batch": batch, "formulation": f,
                      "steps_per_s": float(1.0 / np.median(times[f]))})
    bar.update()
  return results


def bench_sweep(chunks: tuple[int, ...], repeats: int, bandwidth: float, bar) -> dict:
  spec = core.CoreSpec(dim=D, k=K, m=M, batch=SWEEP_BATCH, model=EMBEDDING)
  sim = core.SimSpec()
  world = core.make_world(sim, D)
  points = [core.HParams.create(tau=t, baseline=b, lr=lr, seed=s)
            for t in (0.1, 0.5) for b in (0.0, 0.5) for lr in (1e-3, 3e-3) for s in range(8)]
  hparams = core.stack_hparams(points)
  assert hparams.tau.shape[0] == SWEEP_CONFIGS
  num_params = sum(x.size for x in jax.tree.leaves(
      EMBEDDING.init_params(jax.random.PRNGKey(0), spec)))
  # Adam must read and write the parameters and both moments once per step: the floor on bytes.
  bytes_per_config_step = 6 * num_params * BYTES_F32
  by_chunk = []
  for chunk in chunks:
    bar.set_description(f"sweep, {chunk} configurations per chunk")
    run_chunk = core.make_sweep(spec, sim, SWEEP_STEPS, eval_sessions=16)
    first = jax.tree.map(lambda x, c=chunk: x[:c], hparams)
    run_chunks(run_chunk, first, world, chunk)  # compile
    t = median_time(lambda f=run_chunk, c=chunk: run_chunks(f, hparams, world, c), repeats)
    rate = SWEEP_CONFIGS * SWEEP_STEPS / t
    by_chunk.append({"chunk": chunk, "seconds": t, "config_steps_per_s": rate,
                     "fraction_of_limit": rate * bytes_per_config_step / bandwidth})
    bar.update()
  best = max(by_chunk, key=lambda r: r["config_steps_per_s"])
  return {"configs": SWEEP_CONFIGS, "steps": SWEEP_STEPS, "batch": SWEEP_BATCH,
          "best_chunk": best["chunk"], "config_steps_per_s": best["config_steps_per_s"],
          "bytes_per_config_step": bytes_per_config_step, "bandwidth_bytes_per_s": bandwidth,
          "fraction_of_limit": best["fraction_of_limit"], "by_chunk": by_chunk}


def bench_core(out: Path | None, quick: bool = False, progress: bool = True) -> dict:
  repeats = 3 if quick else 7
  chunks = (2, 64) if quick else (1, 2, 4, 8, 16, 64)
  with tqdm(total=1 + len(TRAIN_BATCHES) + len(chunks), desc="memory bandwidth",
            unit="phase", disable=not progress, file=sys.stderr) as bar:
    bandwidth = measure_bandwidth()
    bar.update()
    train = bench_train(repeats=repeats, min_seconds=0.2 if quick else 1.0, bar=bar)
    s = bench_sweep(chunks, repeats=1 if quick else 3, bandwidth=bandwidth, bar=bar)
  result = {"shape": {"dim": D, "k": K, "m": M}, "train": train, "sweep": s}
  rate = {(r["batch"], r["formulation"]): r["steps_per_s"] for r in train}
  print(f"train_step, D={D} K={K} M={M} (median steps/s)")
  print(f"{'batch':>6s}{'fast':>12s}{'naive':>12s}{'fast/naive':>12s}")
  for batch in TRAIN_BATCHES:
    fast, naive = rate[(batch, "fast")], rate[(batch, "naive")]
    print(f"{batch:6d}{fast:12.1f}{naive:12.1f}{fast / naive:11.2f}x")
  print(f"\nsweep: {s['configs']} configurations x {s['steps']} steps, batch {s['batch']}; "
        f"{s['bytes_per_config_step'] / 1e6:.2f} MB of Adam state per config-step; "
        f"measured bandwidth {s['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s")
  print(f"{'chunk':>6s}{'seconds':>10s}{'config-steps/s':>16s}{'of limit':>10s}")
  for r in s["by_chunk"]:
    print(f"{r['chunk']:6d}{r['seconds']:10.2f}{r['config_steps_per_s']:16.1f}"
          f"{r['fraction_of_limit']:10.2f}")
  write_result(result, out)
  return result
