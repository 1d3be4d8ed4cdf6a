"""The latent simulator's sweep: every configuration x seed through one compiled program
(`core.make_sweep`) in chunks; process 0 writes the outputs, all at the end."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import jax

from rmmjax import core, distributed
from rmmjax.config import Config
from rmmjax.io.workdir import check_sweepable, held, sweep_record
from rmmjax.learners.registry import with_model
from rmmjax.io.metrics_log import window_means
from rmmjax.train.loop import first_last
from rmmjax.train.sweep.chunks import chunk_size, run_chunks
from rmmjax.train.sweep.grid import label, settings, sweep_configs
from rmmjax.train.sweep.table import start, write

# True while a latent sweep computes what it writes only at its end: a stop then loses
# nothing by leaving without waiting for the compiled chunk in flight (minutes, for long
# chunks). Read by the command line when Ctrl-C or SIGTERM stops it.
nothing_kept_in_flight = False


def sweep(cfg: Config, grid: dict[str, list], seeds: int, workdir: Path,
          progress: bool = True, made_by: dict | None = None) -> dict:
  """Runs the sweep into workdir (sweep.json, curves.png, tb/<configuration>/), held by this
  process until it returns."""
  global nothing_kept_in_flight
  with contextlib.ExitStack() as holding:
    with distributed.preflight("configs, grids or workdirs") as found:
      if cfg.config != "latent":
        raise ValueError(f"this sweep runs the latent simulator, not config {cfg.config} (a "
                         "sweep over replayed conversations: rmmjax.train.sweep.replay)")
      configs = sweep_configs(cfg, grid, seeds)
      workdir = Path(workdir)
      if distributed.is_writer():  # one process at a time: the second is refused, naming it
        holding.enter_context(held(workdir, "sweep"))
      check_sweepable(workdir, cfg, grid, seeds)  # before anything is compiled or written
      devices = list(distributed.data_mesh(cfg.devices).devices.flat)  # devices=N: the first N
      found.digest = distributed.digest(cfg.to_json(), json.dumps(grid, sort_keys=True,
                                        default=str), str(seeds), str(workdir.resolve()))
    spec, sim = with_model(cfg.core_spec()), cfg.sim_spec()
    run_chunk = core.make_sweep(spec, sim, cfg.steps, cfg.eval_sessions)
    # (not with several processes, each of which must leave the distributed runtime in step)
    nothing_kept_in_flight = jax.process_count() == 1
    try:
      out = run_chunks(run_chunk, core.stack_hparams([c.hparams() for c in configs]),
                       core.make_world(sim, spec.dim), chunk_size(cfg.sweep_chunk, len(configs)),
                       devices=devices, progress=progress and distributed.is_writer())
    except BaseException as stop:  # (the mark stays up for a stop it lets through)
      nothing_kept_in_flight = nothing_kept_in_flight and isinstance(stop, KeyboardInterrupt)
      raise
    nothing_kept_in_flight = False
    runs, logged = [], []
    for i, c in enumerate(configs):
      rows = window_means({k: v[i] for k, v in out["metrics"].items()}, 0, cfg.log_every)
      run = settings(c, grid) | {
          "seed": c.seed, "recall_at_m_base": float(out["eval_first"]["recall_at_m_base"][i]),
          "recall_at_m_final": float(out["eval_final"]["recall_at_m"][i]),
          "recall_at_k": float(out["eval_final"]["recall_at_k"][i])}
      run["reward_first"], run["reward_last"] = first_last(rows, "reward")
      runs.append(run)
      logged.append((label(settings(c, grid)), rows))
    result = {"config": cfg.config, "steps": cfg.steps, "grid": grid, "seeds": seeds,
              "made_by": made_by or {}, "base_config": cfg.values(), "runs": runs}
    if distributed.is_writer():  # process 0 writes; every process returns the result
      start(workdir, cfg, sweep_record(grid, seeds))
      write(workdir, result, logged, f"seed_mean_of_{seeds}",
            f"sweep: {{}} configurations x {seeds} seeds, {cfg.steps} steps")
    return result
