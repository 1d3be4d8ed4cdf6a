"""A second reading of the cross reranker's candidates, beside the evidence it ranks first: each
held-out question is read once as the reranker serves it, then again with the text of its first
candidate appended to the question, and the other candidates are ordered by the sum of their
two scores (or by the second alone), the first one kept first. Nothing is trained here: the
reranker is the one a sweep of `sweep_cross.py` trained on each of its 2 folds (for the arm
second-reading, trained on such readings too: `cross.second_reading`), and the second reading
asks whether what it has found already tells it where the rest of a question's evidence is
(multi-hop questions need every turn of theirs in the top 5).

The first reading must give each question the Recall@5 the sweep measured for it (its
heldout.json): the script refuses otherwise, so both readings are of the model the sweep
measured. Intervals: 95% paired bootstrap over conversations (2 folds: indicative).

    python experiments/cross_second_reading.py [--arm weakest] [--data PATH] [--workdir DIR]

Writes experiments/results/cross_second_reading_<arm>.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

from published import relative_data, write_record
from replay_common import RESULTS, fold_clusters, write_markdown
import sweep_cross
from rmmjax import core
from rmmjax.data.locomo import load_locomo
from rmmjax.encode.cache import EmbeddingCache, cache_path
from rmmjax.encode.encoder import SentenceEncoder
from rmmjax.eval.intervals import paired_interval
from rmmjax.eval.retrieval import recorded_query_encoder
from rmmjax.learners.cross.pairs import second_reading_query
from rmmjax.learners.cross.reader import CrossReader
from rmmjax.learners.loading import load_reranker
from rmmjax.learners.query_encoder.files import load_query_encoder, query_encoder_record
from rmmjax.learners.query_encoder.fit import retrieval_encoders
from rmmjax.replay.candidates import build_replay
from rmmjax.retrieve.metrics import MRR_DEPTH, question_metrics
from rmmjax.train.sweep.table import ranked_units

READINGS = ("first reading", "second reading, the sum of both scores", "second reading alone")


def fold_readings(run: Path, data: Path, encoder) -> dict:
  """Each held-out question's metrics under every reading, with its conversation and category."""
  import jax  # noqa: PLC0415
  loaded = load_reranker(run)
  measured = json.loads((run / "heldout.json").read_text())["per_question"]
  held = list(dict.fromkeys(q["conversation"] for q in measured))
  qe = recorded_query_encoder(run, loaded.record)
  tuned = load_query_encoder(qe, encoder)
  memory_encoder, query_side = retrieval_encoders(encoder, tuned,
                                                  query_encoder_record(qe).get("tune", "query"))
  convs = [c for c in load_locomo(data)[0] if c.conversation_id in held]
  spec = loaded.spec
  replays = build_replay(convs, "turn", loaded.record["retriever"], memory_encoder, spec.k,
                         depth=max(10, MRR_DEPTH), query_encoder=query_side)
  reader = CrossReader.for_reranker(loaded, encoder)
  scores = jax.jit(core.scores, static_argnums=2, compiler_options=reader.compiler_options())

  def read(question: str, texts_K) -> np.ndarray:
    batch = core.Batch(q_BxD=np.zeros((1, spec.dim), np.float32),
                       mem_BxKxD=np.zeros((1, spec.k, spec.dim), np.float32),
                       mask_BxK=np.array([[t is not None for t in texts_K]]),
                       inputs=reader.inputs(tuple(x[None] for x in reader.candidate_arrays(
                           question, texts_K))))
    return np.asarray(scores(loaded.params, reader.pack(batch), spec))[0]

  out = {"conversations": [], "categories": [], **{r: [] for r in READINGS}}
  for conv in replays:
    texts_NxK = conv.candidate_texts()
    for q, question in enumerate(tqdm(conv.questions, desc=conv.conversation_id, leave=False)):
      texts = texts_NxK[q]
      first = np.where(conv.mask_NxK[q], read(question, texts), -np.inf)
      top = int(np.argmax(first))
      rest = [None if j == top else t for j, t in enumerate(texts)]
      second = np.where(conv.mask_NxK[q], read(second_reading_query(question, texts[top]), rest),
                        -np.inf)
      for name, s in zip(READINGS, (first, first + second, second)):
        s = s.copy()
        s[top] = np.inf  # (what the first reading ranks first stays first)
        out[name].append(question_metrics(ranked_units(conv, q, s), set(conv.evidence[q]),
                                          int(conv.num_relevant_N[q]), (5, 10)))
      out["conversations"].append(conv.conversation_id)
      out["categories"].append(conv.categories[q])
  mine = np.array([m["recall_all@5"] for m in out[READINGS[0]]])
  theirs = np.array([q["recall_all@5"] for q in measured])
  # (one question at a time, as served, against the sweep's batches: rounding may swap a tie)
  out["differing_from_the_sweep"] = int((mine != theirs).sum())
  if abs(mine.mean() - theirs.mean()) > 0.005:
    raise SystemExit(f"{run}: the first reading differs from the sweep's own measurement "
                     f"({mine.mean():.4f} against {theirs.mean():.4f})")
  return out


def table(readings: dict) -> list[str]:
  cats = np.array(readings["categories"])
  convs = readings["conversations"]
  folds = fold_clusters(convs, sweep_cross.FOLDS)
  names = sorted(set(cats))
  values = {r: {m: np.array([q[m] for q in readings[r]]) for m in
                ("recall_all@5", "recall_all@10", "ndcg@10", "mrr")} for r in READINGS}
  lines = ["| reading | R@5 all | R@10 all | NDCG@10 | MRR | " + " | ".join(names)
           + " | R@5 - first reading |", "|---|---|---|---|---|" + "---|" * (len(names) + 1)]
  first = values[READINGS[0]]["recall_all@5"]
  for r in READINGS:
    v = values[r]
    diff = ("" if r == READINGS[0] else
            str(paired_interval(v["recall_all@5"] - first, convs, [folds[c] for c in convs])))
    lines.append(f"| {r} | " + " | ".join(f"{v[m].mean():.3f}" for m in v) + " | "
                 + " | ".join(f"{v['recall_all@5'][cats == c].mean():.3f}" for c in names)
                 + f" | {diff} |")
  return lines


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--arm", default="weakest", choices=sorted(sweep_cross.ARMS))
  parser.add_argument("--data", default=relative_data())
  parser.add_argument("--workdir", help="the arm's sweep (default: sweep_cross.py's)")
  args = parser.parse_args(sys.argv[1:])
  workdir = Path(args.workdir or f"checkpoints/sweeps/cross_{args.arm}")
  encoder = SentenceEncoder(cache=EmbeddingCache(cache_path()))
  readings: dict = {}
  for f in range(sweep_cross.FOLDS):
    run = workdir / "runs" / "000" / f"fold_{f}"
    if not (run / "heldout.json").is_file():
      raise SystemExit(f"{run} holds no finished run: `python experiments/sweep_cross.py --arm "
                       f"{args.arm}{' --workdir ' + str(workdir) if args.workdir else ''}` "
                       "trains and measures it first")
    saved = run / "second_reading.json"  # (a fold read before is not read again)
    if not saved.exists():
      saved.write_text(json.dumps(fold_readings(run, Path(args.data), encoder)))
    for key, values in json.loads(saved.read_text()).items():
      if key == "differing_from_the_sweep":
        print(f"fold {f}: the first reading's Recall@5 differs from the sweep's measurement on "
              f"{values} questions")
        continue
      readings.setdefault(key, []).extend(values)
  argv = ["--arm", args.arm] + (["--data", args.data] if args.data != relative_data() else [])
  lines = [f"# A second reading beside the evidence ranked first ({args.arm} arm's reranker, "
           "2-fold cross-validation)", "", f"`python experiments/cross_second_reading.py "
           f"{' '.join(argv)}`, over the runs of `python experiments/sweep_cross.py --arm "
           f"{args.arm}`. Held-out questions of both folds; R@5 all by category in the middle "
           "columns; intervals: 95% paired bootstrap over conversations (2 folds: "
           "indicative).", "", *table(readings)]
  out = RESULTS / f"cross_second_reading_{args.arm}.md"
  write_markdown(out, lines)
  write_record(out, "cross_second_reading", argv, configs(argv))
  print("\n".join(lines))


def configs(argv: list[str]) -> dict:
  """The runs whose rerankers it reads (see published.py): the arm's sweep's."""
  parser = argparse.ArgumentParser()
  parser.add_argument("--arm", default="weakest")
  parser.add_argument("--data", default=relative_data())
  args = parser.parse_args(argv)
  return sweep_cross.configs(["--arm", args.arm, "--data", args.data])


if __name__ == "__main__":
  main()
