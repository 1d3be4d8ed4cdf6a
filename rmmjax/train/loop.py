"""The training loop: scanned segments of steps, logged, checkpointed, resumable.

The task (tasks.py) says what the steps learn from: the latent simulator or a replayed dataset.

A run advances in segments of `checkpoint_every` steps, each one compiled `lax.scan`. After a
segment its metrics go to metrics.jsonl and TensorBoard and the state to an Orbax checkpoint.
A restarted run resumes from the newest checkpoint; since step t always draws the randomness of
step t, it ends with exactly the metrics of an uninterrupted run.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import jax
import numpy as np
from tqdm import tqdm

from rmmjax.config import Config
from rmmjax.io import metrics_log, plots
from rmmjax.io.checkpoint import Checkpointer
from rmmjax.io.tensorboard import ScalarWriter
from rmmjax.io.workdir import atomic_write_json, atomic_write_text, check_resumable
from rmmjax.train.tasks import make_task

FIRST_LAST_FRACTION = 0.1  # reward_first/last average the first/last tenth of the steps


def window_means(metrics_T: dict, start_step: int, log_every: int) -> list[dict]:
  """Per-step metrics -> one row per window of log_every steps, labelled by its last step."""
  num = len(next(iter(metrics_T.values())))
  rows = []
  for lo in range(0, num, log_every):
    hi = min(lo + log_every, num)
    row = {"step": start_step + hi}
    row.update({k: float(np.mean(v[lo:hi])) for k, v in sorted(metrics_T.items())})
    rows.append(row)
  return rows


def first_last(rows: list[dict], metric: str) -> tuple[float, float]:
  """Means of a metric over the first and last tenth of the logged rows."""
  n = max(1, math.ceil(len(rows) * FIRST_LAST_FRACTION))
  values = np.array([r[metric] for r in rows])
  return float(values[:n].mean()), float(values[-n:].mean())


def _check_finite(metrics_T: dict, start_step: int) -> None:
  for name, values in metrics_T.items():
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
      raise FloatingPointError(f"{name} became {values[bad[0]]} at step {start_step + bad[0] + 1}")


def train(cfg: Config, workdir: Path, progress: bool = True, encoder=None) -> dict:
  """Trains (or resumes) a reranker on the config's task; returns the summary it writes."""
  cfg.validate()
  workdir = Path(workdir)
  check_resumable(workdir, cfg)  # before anything is created or compiled
  task = make_task(cfg, encoder)  # replay tasks embed their dataset here (cached on disk)
  workdir.mkdir(parents=True, exist_ok=True)
  atomic_write_text(workdir / "config.json", cfg.to_json() + "\n")

  eval_first = task.evaluate(task.template)
  checkpointer = Checkpointer(workdir / "checkpoints")
  step = checkpointer.latest_step() or 0
  if step:
    state = checkpointer.restore(step, task.template)
  else:
    state = task.initial_state()  # pretraining, for the replay tasks that have it
    if getattr(task, "pretrain_loss", None) is not None:
      atomic_write_json(workdir / "pretrain.json", {"loss": task.pretrain_loss.tolist()})
  log_path = workdir / "metrics.jsonl"
  rows = metrics_log.rewind(log_path, step)
  writer = ScalarWriter(workdir / "tb", cfg.to_json() if step == 0 else None)
  try:
    with tqdm(total=cfg.steps, initial=step, desc="train", unit="step",
              disable=not progress) as bar:
      while step < cfg.steps:
        n = min(cfg.checkpoint_every, cfg.steps - step)
        state, metrics_T = task.advance(state, n)
        metrics_T = jax.device_get(metrics_T)
        _check_finite(metrics_T, step)
        new_rows = window_means(metrics_T, step, cfg.log_every)
        metrics_log.append_rows(log_path, new_rows)
        writer.write_rows(new_rows)
        rows += new_rows
        step += n
        checkpointer.save(step, state)
        bar.update(n)
        bar.set_postfix(reward=f"{new_rows[-1]['reward']:.3f}",
                        recall=f"{new_rows[-1]['recall_at_m']:.3f}")
  finally:
    writer.close()
    checkpointer.close()

  eval_final = task.evaluate(state)
  summary = {"config": cfg.config, "steps": cfg.steps,
             "recall_at_m_base": eval_first["recall_at_m_base"],
             "recall_at_m_first": eval_first["recall_at_m"],
             "recall_at_m_final": eval_final["recall_at_m"],
             "recall_at_k": eval_final["recall_at_k"],
             "eval_queries": task.eval_queries, "k": cfg.k, "m": cfg.m}
  if "recall_at_m_prequential" in eval_final:
    summary["recall_at_m_prequential"] = eval_final["recall_at_m_prequential"]
    summary["heldout_conversations"] = [c.conversation_id for c in task.test_convs]
  pretrain_path = workdir / "pretrain.json"
  if pretrain_path.exists():
    loss = [{"loss": x} for x in json.loads(pretrain_path.read_text())["loss"]]
    summary["pretrain_loss_first"], summary["pretrain_loss_last"] = first_last(loss, "loss")
  for metric in ("reward", "citation_rate"):
    summary[f"{metric}_first"], summary[f"{metric}_last"] = first_last(rows, metric)
  atomic_write_json(workdir / "summary.json", summary)
  steps_T = np.array([r["step"] for r in rows])
  curves = {cfg.config: {m: np.array([[r[m] for r in rows]]) for m in plots.CURVE_METRICS}}
  plots.plot_curves(workdir / "curves.png", steps_T, curves,
                    title=f"{cfg.config}: tau={cfg.tau} b={cfg.baseline} ({cfg.baseline_kind}) "
                          f"lr={cfg.lr} seed={cfg.seed}")
  return summary
