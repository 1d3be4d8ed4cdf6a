"""A replay sweep's results from its folds' files: the metrics of every configuration x fold x
seed (those `rmmjax eval` reports, rmmjax.eval.metrics), the table with paired intervals over
conversations, and the online curves."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rmmjax.config import get_value
from rmmjax.eval.metrics import question_metrics
from rmmjax.replay.candidates import base_recall, ceiling_recall
from rmmjax.train.loop import window_means

BOOTSTRAP_DRAWS = 2000
FOLD_FILE = "folds/fold_{}.npz"
ONLINE_CURVES = ("reward", "citation_rate", "recall_at_m", "entropy")


def fold_file(workdir, f: int) -> dict:
  """A finished fold's arrays (rmmjax.train.replay_sweep writes them)."""
  with np.load(Path(workdir) / FOLD_FILE.format(f)) as data:
    return {k: data[k] for k in data.files}


def ranked_units(conv, q: int, scores_K: np.ndarray) -> list[tuple[tuple[str, ...], int]]:
  """(turns, words) of question q's units in the reranker's order of its K candidates, then
  the base order's beyond them (as `eval` ranks them)."""
  k = len(scores_K)
  row = conv.order_NxR[q]
  present = [i for i in range(k) if row[i] >= 0]
  order = sorted(present, key=lambda i: -scores_K[i])  # stable: ties keep the base order
  units = [int(row[i]) for i in order] + [int(u) for u in row[k:] if u >= 0]
  return [(conv.unit_turns[u], conv.unit_words[u]) for u in units]


def fold_metrics(test, scores_CxQxK: np.ndarray, m: int) -> dict[str, np.ndarray]:
  """Per configuration and question: recall_all@m, recall_any@m, ndcg@10 and mrr."""
  rows = []
  for c in range(scores_CxQxK.shape[0]):
    q_all, per_q = 0, []
    for conv in test:
      for q in range(len(conv.questions)):
        per_q.append(question_metrics(ranked_units(conv, q, scores_CxQxK[c, q_all]),
                                      set(conv.evidence[q]), int(conv.num_relevant_N[q]), (m,)))
        q_all += 1
    rows.append(per_q)
  names = (f"recall_all@{m}", f"recall_any@{m}", "ndcg@10", "mrr")
  return {n: np.array([[r[n] for r in per_q] for per_q in rows]) for n in names}


def paired_interval(diff_Q: np.ndarray, clusters_Q: list[str]) -> tuple[float, float, float]:
  """Mean of a per-question difference and its 95% interval, conversations resampled with
  replacement (all questions of each drawn conversation kept)."""
  ids, which = np.unique(np.array(clusters_Q), return_inverse=True)
  sums = np.bincount(which, diff_Q, len(ids))
  counts = np.bincount(which, minlength=len(ids))
  draws = np.random.default_rng(0).integers(0, len(ids), (BOOTSTRAP_DRAWS, len(ids)))
  means = sums[draws].sum(1) / counts[draws].sum(1)
  low, high = np.percentile(means, [2.5, 97.5])
  return float(diff_Q.mean()), float(low), float(high)


def _label(settings: dict) -> str:
  return ",".join(f"{k}={v}" for k, v in settings.items()) or "default"


def summarise(cfg, grid, seeds, plan, replays, workdir) -> dict:
  """sweep.json's content from the folds' files."""
  keys, m = list(grid), cfg.m
  runs, conversations, categories, base, ceiling = [], [], [], [], []
  per_config: dict[str, list[np.ndarray]] = {}
  for f, test_idx in enumerate(plan.fold_tests):
    test = [replays[i] for i in test_idx]
    data = fold_file(workdir, f)
    metrics = fold_metrics(test, data["scores"], m)
    cats = [cat for c in test for cat in c.categories]
    conversations += [c.conversation_id for c in test for _ in c.questions]
    categories += cats
    fold_base = np.concatenate([base_recall(c, m) for c in test])
    fold_ceiling = np.concatenate([ceiling_recall(c) for c in test])
    base.append(fold_base)
    ceiling.append(fold_ceiling)
    for name, values in metrics.items():
      per_config.setdefault(name, []).append(values)
    per_config.setdefault("prequential", []).append(data["prequential"])
    for i, c in enumerate(plan.configs):
      run = {"settings": {k: get_value(c, k) for k in keys}, "seed": c.seed, "fold": f,
             "heldout_conversations": [x.conversation_id for x in test],
             "questions": len(cats),
             "recall_at_m_base": float(fold_base.mean()), "recall_at_k": float(fold_ceiling.mean()),
             "recall_at_m_prequential": float(data["prequential"][i].mean())}
      run.update({name: float(values[i].mean()) for name, values in metrics.items()})
      run["recall_all_by_category"] = {
          cat: float(metrics[f"recall_all@{m}"][i][np.array(cats) == cat].mean())
          for cat in sorted(set(cats))}
      runs.append(run)
  pooled = {name: np.concatenate(parts, axis=1) for name, parts in per_config.items()}
  base_Q, ceiling_Q = np.concatenate(base), np.concatenate(ceiling)
  rows = _rows(plan.configs, keys, pooled, m)
  best = max(rows, key=lambda r: r["recall"])
  for row in rows:
    row["vs_base"] = paired_interval(row["per_question"] - base_Q, conversations)
    row["vs_best"] = paired_interval(row["per_question"] - best["per_question"], conversations)
  result = {"config": cfg.config, "learner": cfg.learner, "variant": cfg.variant,
            "steps": cfg.steps, "grid": grid, "seeds": seeds, "folds": len(plan.fold_tests),
            "fold_conversations": [[replays[i].conversation_id for i in t]
                                   for t in plan.fold_tests],
            "recall_at_m_base": float(base_Q.mean()), "recall_at_k": float(ceiling_Q.mean()),
            "runs": runs,
            "rows": [{k: v for k, v in r.items() if k != "per_question"} for r in rows],
            "best": {"settings": best["settings"], "recall_all": best["recall"]}}
  result["table"] = table(cfg, result, rows, m)
  return result


def _rows(configs, keys, pooled, m) -> list[dict]:
  """One row per grid point: per-question values averaged over its seeds."""
  groups: dict[str, list[int]] = {}
  settings = {}
  for i, c in enumerate(configs):
    label = _label({k: get_value(c, k) for k in keys})
    groups.setdefault(label, []).append(i)
    settings[label] = {k: get_value(c, k) for k in keys}
  rows = []
  for label, idx in groups.items():
    per_q = pooled[f"recall_all@{m}"][idx].mean(0)
    rows.append({"label": label, "settings": settings[label], "seeds": len(idx),
                 "per_question": per_q, "recall": float(per_q.mean()),
                 "recall_any": float(pooled[f"recall_any@{m}"][idx].mean()),
                 "ndcg": float(pooled["ndcg@10"][idx].mean()),
                 "mrr": float(pooled["mrr"][idx].mean()),
                 "prequential": float(pooled["prequential"][idx].mean())})
  return rows


def table(cfg, result, rows, m) -> list[str]:
  fmt = lambda t: f"{t[0]:+.3f} [{t[1]:+.3f}, {t[2]:+.3f}]"  # noqa: E731
  lines = [f"Held-out over {result['folds']} folds of the conversations (contiguous in the "
           f"file's order), {result['seeds']} seed(s) per configuration, learner="
           f"{cfg.learner} variant={cfg.variant}, {cfg.steps} online steps after "
           f"{cfg.learning.pretrain_epochs} pretraining epochs (mode={cfg.mode}). "
           f"Recall@{m} of the base order {result['recall_at_m_base']:.3f}, of all K={cfg.k} "
           f"candidates {result['recall_at_k']:.3f}. Intervals: 95%, conversations resampled; "
           "the best row is chosen on these same folds.", "",
           f"| configuration | R@{m} all | R@{m} any | NDCG@10 | MRR | R@{m} learning online "
           "| vs base | vs best |", "|---|---|---|---|---|---|---|---|"]
  for r in sorted(rows, key=lambda r: -r["recall"]):
    lines.append(f"| {r['label']} | {r['recall']:.3f} | {r['recall_any']:.3f} | "
                 f"{r['ndcg']:.3f} | {r['mrr']:.3f} | {r['prequential']:.3f} | "
                 f"{fmt(r['vs_base'])} | {fmt(r['vs_best'])} |")
  return lines


def curves(workdir, plan, keys, log_every) -> tuple[dict, np.ndarray]:
  """label -> metric -> (folds x seeds, T) window means of the online curves, and the steps."""
  out, steps_T = {}, None
  for f in range(len(plan.fold_tests)):
    data = fold_file(workdir, f)
    if "online_reward" not in data:
      return {}, np.zeros(0)
    for i, c in enumerate(plan.configs):
      rows = window_means({k: data[f"online_{k}"][i] for k in ONLINE_CURVES}, 0, log_every)
      steps_T = np.array([r["step"] for r in rows])
      by_metric = out.setdefault(_label({k: get_value(c, k) for k in keys}), {})
      for metric in ONLINE_CURVES:
        by_metric.setdefault(metric, []).append([r[metric] for r in rows])
  return {label: {m: np.array(v) for m, v in d.items()} for label, d in out.items()}, steps_T
