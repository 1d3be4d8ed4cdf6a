"""`rmmjax bench scaling`: data-parallel throughput on 1, 2 and 4 devices, each count in a
process of its own (JAX fixes the count at start-up). See docs/distributed.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np

from rmmjax import core, distributed
from rmmjax.bench.core import median_time, write_result
from rmmjax.config import get_config
from rmmjax.encode.encoder import SentenceEncoder
from rmmjax.encode.tuned import encoder_state
from rmmjax.learners.query_encoder.fit import encoder_replay_steps
from rmmjax.learners.registry import with_model
from rmmjax.train.sweep.chunks import run_chunks

COUNTS = (1, 2, 4)
CONFIGS, BATCH, K, TOKENS = 8, 16, 20, 32


def _child(devices: int, quick: bool) -> dict:
  if len(jax.devices()) < devices:
    return {"devices": devices, "skipped": f"only {len(jax.devices())} devices"}
  repeats, steps = (2, 20) if quick else (3, 100)
  cfg = get_config("latent")
  spec, sim = with_model(cfg.core_spec()), cfg.sim_spec()
  world = core.make_world(sim, spec.dim)
  hparams = core.stack_hparams([cfg.hparams()] * CONFIGS)
  run = core.make_sweep(spec, sim, steps, 8)
  chosen = jax.devices()[:devices]
  sweep = lambda: run_chunks(run, hparams, world, CONFIGS, devices=chosen)  # noqa: E731
  sweep()
  sweep_s = median_time(sweep, repeats)

  encoder = SentenceEncoder()
  rng = np.random.default_rng(0)
  enc_steps = 2 if quick else 5
  mem = rng.standard_normal((enc_steps, BATCH, K, encoder.dim)).astype(np.float32)
  mem /= np.linalg.norm(mem, axis=-1, keepdims=True)
  relevant = np.zeros((enc_steps, BATCH, K), bool)
  relevant[:, :, 0] = True
  stream = core.Batch(q_BxD=np.zeros((enc_steps, BATCH, encoder.dim), np.float32),
                      mem_BxKxD=mem, mask_BxK=np.ones((enc_steps, BATCH, K), bool),
                      relevant_BxK=relevant, num_relevant_B=np.ones((enc_steps, BATCH), np.int32))
  inputs = (stream, rng.integers(1000, 5000, (enc_steps, BATCH, TOKENS)).astype(np.int32),
            np.ones((enc_steps, BATCH, TOKENS), np.int32))  # (ids, mask)
  espec = core.CoreSpec(dim=encoder.dim, k=K, m=5, batch=BATCH, rank_prior=True)
  state = encoder_state(encoder, espec, core.HParams.create(lr=1e-5, tau=0.5))
  if devices > 1:
    mesh = distributed.data_mesh(devices)
    inputs = distributed.shard_leading(inputs, mesh, axis=1)
    state = distributed.replicate(state, mesh)
  step = jax.jit(lambda s, st, i, m: encoder_replay_steps(encoder.module, s, st, i, m,
                                                          enc_steps))
  train = lambda: jax.block_until_ready(step(state, *inputs))  # noqa: E731
  train()
  train_s = median_time(train, repeats)
  return {"devices": devices, "device_kind": jax.devices()[0].device_kind,
          "sweep_config_steps_per_s": CONFIGS * steps / sweep_s,
          "encoder_questions_per_s": enc_steps * BATCH / train_s, "repeats": repeats}


def bench_scaling(out: Path | None, quick: bool = False) -> dict:
  fake = jax.default_backend() == "cpu"
  rows = []
  for n in COUNTS:
    env = dict(os.environ)
    if fake:
      env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                          f" --xla_force_host_platform_device_count={n}").strip()
    run = subprocess.run([sys.executable, "-m", "rmmjax.bench.scaling", str(n),
                          "quick" if quick else "full"], env=env, capture_output=True,
                         text=True, timeout=1800)
    if run.returncode != 0:
      raise RuntimeError(f"the {n}-device run failed: {run.stderr[-1500:]}")
    rows.append(json.loads(run.stdout.strip().splitlines()[-1]))
  result = {"fake_cpu_devices": fake, "rows": rows,
            "workloads": {"sweep": f"{CONFIGS} latent configurations in one chunk",
                          "encoder": f"MiniLM REINFORCE, batch {BATCH}, K={K}, {TOKENS} tokens"}}
  print(f"data parallel, median of {rows[0].get('repeats', '-')} runs"
        + ("; fake CPU devices sharing the same cores: overhead, not speed-up" if fake else ""))
  print(f"{'devices':>8s}{'sweep config-steps/s':>24s}{'encoder questions/s':>22s}")
  for row in rows:
    if "skipped" in row:
      print(f"{row['devices']:8d}   skipped: {row['skipped']}")
      continue
    print(f"{row['devices']:8d}{row['sweep_config_steps_per_s']:24.0f}"
          f"{row['encoder_questions_per_s']:22.1f}")
  write_result(result, out)
  return result


if __name__ == "__main__":
  print(json.dumps(_child(int(sys.argv[1]), sys.argv[2] == "quick")))
