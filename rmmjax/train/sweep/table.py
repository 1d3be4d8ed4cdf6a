"""A sweep's record: sweep.json, the table of a replay sweep (sweep.md: eval's metrics with paired
intervals, rmmjax.eval.intervals) and its curves (tb/, curves.png, online.png)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from rmmjax.eval.intervals import Interval, paired_interval
from rmmjax.retrieve.metrics import question_metrics
from rmmjax.io import plots, tensorboard
from rmmjax.io.workdir import atomic_write_json, atomic_write_text, write_run_record
from rmmjax.replay.candidates import ceiling_recall
from rmmjax.train.sweep.grid import label, settings

POSITION_BINS = 5  # parts of each held-out conversation in the learning-online curve
METRICS = ("recall_all@{m}", "recall_any@{m}", "recall_all@10", "ndcg@10", "mrr")
_TITLES = {"ndcg@10": "NDCG@10", "mrr": "MRR"}


def metric_names(m: int) -> list[str]:
  """METRICS at M = m (once each where m is 10)."""
  return list(dict.fromkeys(name.format(m=m) for name in METRICS))


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
  """Per configuration and question: each of `metric_names(m)`."""
  questions = [(conv, q) for conv in test for q in range(len(conv.questions))]
  rows = [[question_metrics(ranked_units(conv, q, scores_QxK[i]), set(conv.evidence[q]),
                            int(conv.num_relevant_N[q]), tuple(dict.fromkeys((m, 10))))
           for i, (conv, q) in enumerate(questions)] for scores_QxK in scores_CxQxK]
  return {n: np.array([[r[n] for r in per_q] for per_q in rows]) for n in metric_names(m)}


def by_part(diff_SxQ: np.ndarray, clusters_Q: list[str], groups_Q: list[str], folds_Q,
            parts: int = POSITION_BINS) -> list[Interval]:
  """paired_interval of a per-question difference in each of `parts` parts of the replay: each
  conversation's questions of each category (LoCoMo lists them category by category) are cut
  into `parts` equal parts in order, so parts differ by how far the replay has gone, not by kind
  of question. Parts empty everywhere are left out."""
  clusters, groups, folds = np.array(clusters_Q), np.array(groups_Q), np.asarray(folds_Q)
  diff_SxQ = np.atleast_2d(diff_SxQ)
  part_Q = np.zeros(len(clusters), int)
  for key in set(zip(clusters_Q, groups_Q)):
    where = np.flatnonzero((clusters == key[0]) & (groups == key[1]))
    part_Q[where] = np.arange(len(where)) * parts // len(where)
  return [paired_interval(diff_SxQ[:, part_Q == p], clusters[part_Q == p], folds[part_Q == p])
          for p in range(parts) if (part_Q == p).any()]


@dataclasses.dataclass
class FoldResult:
  """One fold's held-out questions, in order, and every configuration's metrics of each:
  metrics[name] is (configurations, questions); prequential (learning online) if measured.
  `base` and `best` hold the same metrics, (questions,), of the base order and of the best
  order of the K candidates (where every configuration reranked the same ones)."""

  conversations: list[str]  # each question's conversation
  categories: list[str]
  base: dict[str, np.ndarray]
  ceiling: np.ndarray | None  # the K candidates' recall, where known
  metrics: dict[str, np.ndarray]
  prequential: np.ndarray | None = None
  best: dict[str, np.ndarray] | None = None


def replay_fold(test, data: dict, m: int) -> FoldResult:
  """A fold of a vmapped replay sweep from its file: eval's metrics from the saved scores, and
  of the base order (descending scores in its order) and the best order (evidence first)."""
  k = data["scores"].shape[-1]
  base_QxK = np.broadcast_to(-np.arange(k, dtype=np.float32), data["scores"].shape[1:])
  best_QxK = np.concatenate([c.relevant_NxK for c in test]).astype(np.float32)
  both = fold_metrics(test, np.stack([base_QxK, best_QxK]), m)
  return FoldResult([c.conversation_id for c in test for _ in c.questions],
                    [cat for c in test for cat in c.categories],
                    {name: v[0] for name, v in both.items()},
                    np.concatenate([ceiling_recall(c) for c in test]),
                    fold_metrics(test, data["scores"], m), data["prequential"],
                    {name: v[1] for name, v in both.items()})


def summarise(cfg, grid, seeds, configs, folds: list[FoldResult], data_sha256: str,
              made_by: dict | None = None) -> dict:
  """sweep.json's content: a run per configuration x fold, a row per grid point, and how it was
  made (`made_by`: the commands, working folders and commits that started and wrote it)."""
  keys, m = list(grid), cfg.m
  runs = []
  for f, fold in enumerate(folds):
    cats = np.array(fold.categories)
    for i, c in enumerate(configs):
      run = {"settings": settings(c, keys), "seed": c.seed, "fold": f,
             "heldout_conversations": list(dict.fromkeys(fold.conversations)),
             "questions": len(cats),
             "recall_at_m_base": float(fold.base[f"recall_all@{m}"].mean())}
      if fold.ceiling is not None:
        run["recall_at_k"] = float(fold.ceiling.mean())
      if fold.prequential is not None:
        run["recall_at_m_prequential"] = float(fold.prequential[i].mean())
      run.update({name: float(values[i].mean()) for name, values in fold.metrics.items()})
      run["recall_all_by_category"] = {
          cat: float(fold.metrics[f"recall_all@{m}"][i][cats == cat].mean())
          for cat in sorted(set(fold.categories))}
      runs.append(run)
  conversations = [c for fold in folds for c in fold.conversations]
  categories = [c for fold in folds for c in fold.categories]
  folds_Q = [f for f, fold in enumerate(folds) for _ in fold.conversations]
  pooled = {name: np.concatenate([fold.metrics[name] for fold in folds], axis=1)
            for name in folds[0].metrics}
  if folds[0].prequential is not None:
    pooled["prequential"] = np.concatenate([fold.prequential for fold in folds], axis=1)
  names = metric_names(m)
  base = {name: np.concatenate([fold.base[name] for fold in folds]) for name in names}
  best_order = ({name: np.concatenate([fold.best[name] for fold in folds]) for name in names}
                if all(fold.best is not None for fold in folds) else None)
  base_Q = base[f"recall_all@{m}"]
  ceiling_Q = (np.concatenate([fold.ceiling for fold in folds])
               if all(fold.ceiling is not None for fold in folds) else None)
  rows = _rows(configs, keys, pooled, m)

  def by_category(values_Q) -> dict[str, float]:  # (over a row's seeds too)
    cats_Q = np.array(categories)
    return {c: float(np.mean(np.asarray(values_Q)[..., cats_Q == c]))
            for c in sorted(set(categories))}
  best = max(rows, key=lambda r: r["recall"])
  for row in rows:  # (each seed of a row is its own model: paired with the best row's same seed)
    row["vs_base"] = paired_interval(row["per_seed_question"] - base_Q, conversations, folds_Q)
    row["by_category"] = by_category(row["per_seed_question"])
    row["metrics_by_category"] = {name: {"overall": float(row[f"per_{name}"].mean())}
                                  | by_category(row[f"per_{name}"]) for name in names}
    row["vs_best"] = paired_interval(row["per_seed_question"] - best["per_seed_question"],
                                     conversations, folds_Q)
    if "prequential_per_seed_question" in row:
      # Learning online from simulated citations alone on conversations whose labels it
      # never saw, against the same reranker frozen: overall and along the conversation.
      gain_SxQ = row.pop("prequential_per_seed_question") - row["per_seed_question"]
      row["online_vs_frozen"] = paired_interval(gain_SxQ, conversations, folds_Q)
      row["online_vs_frozen_by_part"] = by_part(gain_SxQ, conversations, categories, folds_Q)
  result = {"config": cfg.config, "learner": cfg.learner,
            "steps": cfg.steps, "grid": grid, "seeds": seeds, "folds": len(folds),
            "made_by": made_by or {}, "base_config": cfg.resolved().values(),
            "data": str(Path(cfg.data).resolve()), "data_sha256": data_sha256,
            "fold_conversations": [list(dict.fromkeys(f.conversations)) for f in folds],
            "recall_at_m_base": float(base_Q.mean()),
            "base_by_category": by_category(base_Q),
            "runs": runs,
            "rows": [{k: (list(v) if isinstance(v, Interval) else
                          [list(i) for i in v] if k.endswith("_by_part") else v)
                      for k, v in r.items() if not k.startswith("per_")} | {
                         "interval_over": r["vs_base"].over} for r in rows],
            "best": {"settings": best["settings"], "recall_all": best["recall"]}}
  # Each metric overall and by category: of the base order, and of the best order of the K.
  result["beside"] = {name: {metric: {"overall": float(v.mean())} | by_category(v)
                             for metric, v in values.items()}
                      for name, values in (("base order", base),
                                             ("best order of the K candidates", best_order))
                      if values is not None}
  if ceiling_Q is not None:
    result["k"] = configs[0].k
    result["recall_at_k"] = float(ceiling_Q.mean())
    result["ceiling_by_category"] = by_category(ceiling_Q)
  result["table"] = table(cfg, result, rows, m)
  return result


def _rows(configs, keys, pooled, m) -> list[dict]:
  """One row per grid point: per-question values averaged over its seeds."""
  groups: dict[str, list[int]] = {}
  for i, c in enumerate(configs):
    groups.setdefault(label(settings(c, keys)), []).append(i)
  rows = []
  for name, idx in groups.items():
    mean = lambda key, idx=idx: float(pooled[key][idx].mean())  # noqa: E731
    rows.append({"label": name, "settings": settings(configs[idx[0]], keys), "seeds": len(idx),
                 "per_seed_question": pooled[f"recall_all@{m}"][idx],
                 "recall": mean(f"recall_all@{m}"), "recall_any": mean(f"recall_any@{m}"),
                 "recall_10": mean("recall_all@10"),
                 "ndcg": mean("ndcg@10"), "mrr": mean("mrr")}
                | {f"per_{n}": pooled[n][idx] for n in metric_names(m)})
    if "prequential" in pooled:
      rows[-1] |= {"prequential": mean("prequential"),
                   "prequential_per_seed_question": pooled["prequential"][idx]}
  return rows


def _schedule(cfg, grid_keys) -> str:
  """What a run trains, as its mode says (the keys of a stage it skips are not used)."""
  if {k.rpartition(".")[2] for k in grid_keys} & {"mode", "steps", "pretrain_epochs"}:
    return "the training schedule as each row sets it"
  online = f"{cfg.steps} online steps" if "rl" in cfg.mode.split("+") else "no online steps"
  if "pretrain" not in cfg.mode:
    return f"{online}, no pretraining (mode={cfg.mode})"
  return f"{online} after {cfg.learning.pretrain_epochs} pretraining epochs (mode={cfg.mode})"


def _resampled(over: str, result: dict) -> str:
  """What an interval of the table resampled, in words."""
  clusters = (f"the {result['folds']} folds (each its own trained model)"
              if over.startswith("folds") else
              f"the conversations ({result['folds']} folds are too few to resample: the "
              "interval understates the uncertainty and a comparison is indicative)")
  return clusters + (f", and each drawn one's {result['seeds']} seeds" if "seeds" in over else "")


def table(cfg, result, rows, m) -> list[str]:
  online = "online_vs_frozen" in rows[0]
  k = result.get("k")  # (the runs' K where they share their candidates, and so a ceiling)
  ceiling = (f", of all K={k} candidates {result['recall_at_k']:.3f}"
             if "recall_at_k" in result else "")
  lines = [f"Held-out over {result['folds']} folds of the conversations (contiguous in the "
           f"file's order), {result['seeds']} seed(s) per configuration; learner="
           f"{cfg.learner}, {_schedule(cfg, result['grid'])}. "
           f"Recall@{m} of the base order {result['recall_at_m_base']:.3f}{ceiling}. Intervals: "
           f"95% paired bootstrap, {_resampled(rows[0]['vs_base'].over, result)}; the best row "
           "is chosen on these same folds."
           + (" Learning online: the trained reranker goes on learning from each held-out "
              "batch's simulated citations after ranking it (no labels of those "
              "conversations), against the same reranker frozen." if online else ""), ""]
  ranked = sorted(rows, key=lambda r: -r["recall"])
  columns = {"configuration": "{label}", f"R@{m} all": "{recall:.3f}",
             f"R@{m} any": "{recall_any:.3f}",
             **({"R@10 all": "{recall_10:.3f}"} if m != 10 else {}),
             "NDCG@10": "{ndcg:.3f}", "MRR": "{mrr:.3f}", "vs base": "{vs_base}",
             "vs best": "{vs_best}",
             **({f"R@{m} learning online": "{prequential:.3f}",
                 "online - frozen": "{online_vs_frozen}"} if online else {})}
  lines += ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
  lines += ["| " + " | ".join(f.format(**r) for f in columns.values()) + " |" for r in ranked]
  categories = list(result["base_by_category"])
  for metric in metric_names(m):
    if metric.startswith("recall_any"):
      continue
    title = _TITLES.get(metric) or f"R@{metric.rpartition('@')[2]} all"
    beside = [(name, values[metric]) for name, values in result["beside"].items()]
    if metric == f"recall_all@{m}" and "recall_at_k" in result:
      beside.append((f"all K={k} candidates",
                     {"overall": result["recall_at_k"]} | result["ceiling_by_category"]))
    lines += ["", f"{title} by category, beside the " + " and the ".join(
        name for name, _ in beside) + ":", "",
              "| | overall | " + " | ".join(categories) + " |",
              "|---|---|" + "---|" * len(categories)]
    for name, values in [(r["label"], r["metrics_by_category"][metric])
                         for r in ranked] + beside:
      lines.append(f"| {name} | " + " | ".join(
          f"{values[c]:.3f}" for c in ["overall", *categories]) + " |")
  if online:
    parts = len(rows[0]["online_vs_frozen_by_part"])
    lines += ["", f"Learning online - frozen along the replay of the held-out conversations: "
              f"each conversation's questions of each category cut into {parts} equal parts in "
              "the order they are replayed (part p: every category's p-th share, so parts "
              "differ by how far the replay has gone, not by kind of question); intervals as "
              "above:", "",
              "| configuration | " + " | ".join(f"part {p + 1}" for p in range(parts)) + " |",
              "|---|" + "---|" * parts]
    lines += [f"| {r['label']} | " + " | ".join(map(str, r["online_vs_frozen_by_part"])) + " |"
              for r in ranked]
  return lines


def start(workdir: Path, cfg, record: dict) -> None:
  """The sweep's manifest and base config, before its outputs."""
  workdir.mkdir(parents=True, exist_ok=True)
  write_run_record(workdir, record)
  atomic_write_text(workdir / "config.json", cfg.resolved().to_json() + "\n")


def write(workdir: Path, result: dict, logged: list[tuple[str, list[dict]]], prefix: str,
          title: str) -> None:
  """sweep.json, sweep.md and online.png where the sweep has them, and the mean curves of each
  configuration's `logged` (label, rows): tb/ (rewritten whole: a rerun leaves no second copy of
  its points) and curves.png (`title`, {} the number of configurations)."""
  lines = {}  # label -> metric -> (runs, T)
  for name, rows in logged:
    for metric in (k for k in rows[0] if k != "step"):
      lines.setdefault(name, {}).setdefault(metric, []).append([r[metric] for r in rows])
  if lines:
    steps_T = np.array([r["step"] for r in logged[0][1]])
    lines = {name: {m: np.array(v) for m, v in d.items()} for name, d in lines.items()}
    tensorboard.rewrite(workdir / "tb", {name.replace("/", "_"): [
        {"step": int(s), **{m: float(v[:, t].mean()) for m, v in by_metric.items()}}
        for t, s in enumerate(steps_T)] for name, by_metric in lines.items()}, prefix=prefix)
    plots.plot_curves(workdir / "curves.png", steps_T, lines, title=title.format(len(lines)))
  parts = {r["label"]: r["online_vs_frozen_by_part"] for r in result.get("rows", ())
           if "online_vs_frozen_by_part" in r}
  if parts:
    plots.plot_parts(workdir / "online.png", parts,
                     ylabel=f"Recall@{result['base_config']['m']}: learning online - frozen",
                     title="learning from citations alone on held-out conversations")
  atomic_write_json(workdir / "sweep.json", result)
  if "table" in result:
    atomic_write_text(workdir / "sweep.md", "\n".join(result["table"]) + "\n")
