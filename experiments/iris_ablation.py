"""IRIS against single-pass retrieval on LaceMem, per LoCoMo category, with the component
ablation and the oracle judge as the ceiling (LoCoMo dev file, 8 conversations).

Every configuration searches the same LaceMem per conversation (offline clause facts, hybrid
BM25 + MiniLM search over facts, edges: same turn 1.0, same session 0.7, semantic >= 0.7).
Recall@k counts the evidence turns among the first k distinct turns of the ranked evidence;
latency is retrieval alone (no judge), p50 / p95 over questions, every query embedded afresh.

    python experiments/iris_ablation.py [--data PATH]

Writes experiments/results/iris_ablation.md (and .json). Its record (iris_ablation.config.json,
see published.py) holds no run: every row runs IRIS's search (or one search) with the settings
pinned below (rmmjax.retrieve.iris.IrisSettings) and a rule-based or oracle judge, and nothing
is trained, so no configuration (rmmjax.config.Config) is made; `configs` is empty.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np

from published import write_record
from replay_common import DEFAULT_DATA, RESULTS, write_markdown
from rmmjax.data.locomo import load_locomo
from rmmjax.encode.cache import EmbeddingCache, cache_path
from rmmjax.encode.encoder import SentenceEncoder
from rmmjax.eval.iris_eval import make_judge
from rmmjax.retrieve.iris import SINGLE_PASS_DEPTH, single_pass
from rmmjax.retrieve.metrics import turn_metrics
from rmmjax.retrieve.metrics import aggregate
from rmmjax.memory.lace import LaceMem
from rmmjax.retrieve.iris import IrisSettings, iris_retrieve

OUT = RESULTS / "iris_ablation"
FULL = IrisSettings()
CONFIGS = [
    ("single-pass (one search of the question)", None, None),
    ("IRIS, heuristic judge", FULL, "heuristic"),
    ("  without the refinement path", dataclasses.replace(FULL, use_refinement_path=False),
     "heuristic"),
    ("  without edges", dataclasses.replace(FULL, use_edges=False), "heuristic"),
    ("  with entity buffers", dataclasses.replace(FULL, use_entity_buffers=True),
     "heuristic"),
    ("  without the temporal schedule", dataclasses.replace(FULL, use_temporal_schedule=False),
     "heuristic"),
    ("  without pseudo-relevance feedback", dataclasses.replace(FULL, feedback_terms=0),
     "heuristic"),
    ("  in entry order (no fused final ranking)", dataclasses.replace(FULL, final_order="entry"),
     "heuristic"),
    ("IRIS, oracle judge, entry order", dataclasses.replace(FULL, final_order="entry"),
     "oracle"),
    ("IRIS, oracle judge (ceiling)", FULL, "oracle"),
]
KS = (5, 10)
CATEGORIES = ("multi-hop", "temporal")


def parse(argv: list[str]) -> argparse.Namespace:
  parser = argparse.ArgumentParser()
  parser.add_argument("--data", default=str(DEFAULT_DATA))
  return parser.parse_args(argv)


def configs(argv: list[str]) -> dict:
  """No run trains (see the module's docstring): {}."""
  parse(argv)
  return {}


def main() -> None:
  args = parse(sys.argv[1:])
  conversations = [c for c in load_locomo(Path(args.data))[0] if c.questions]
  encoder = SentenceEncoder(cache=EmbeddingCache(cache_path()))
  start = time.time()
  stores = [LaceMem.from_conversation(c, encoder) for c in conversations]
  # Every query is embedded afresh (no cache), by single-pass and IRIS alike, so latencies
  # compare the same work whichever configuration ran first.
  for store in stores:
    store.query_encoder = encoder.with_cache(None)
  print(f"built {len(stores)} LaceMems ({sum(len(s) for s in stores)} facts) in "
        f"{time.time() - start:.0f} s", flush=True)
  results = {}
  for label, settings, judge in CONFIGS:
    start = time.time()
    rows = []
    for conv, store in zip(conversations, stores):
      for q in conv.questions:
        if settings is None:
          turns, seconds = single_pass(store, q.question, SINGLE_PASS_DEPTH)
          iterations = 1
        else:
          result = iris_retrieve(store, q.question, category=q.category,
                                 judge=make_judge(judge, q, store), settings=settings)
          turns, seconds, iterations = list(result.turn_ids), result.retrieval_s, result.iterations
        m = turn_metrics(store, turns, q.evidence, KS, len(set(q.evidence)))
        rows.append((q.category, m | {"iterations": iterations, "latency_ms": 1e3 * seconds}))
    agg = aggregate(rows)
    lat = np.array([m["latency_ms"] for _, m in rows])
    results[label] = {
        "overall": {k: agg["overall"][k] for k in ("recall_all@5", "recall_all@10")},
        **{c: agg["by_category"][c]["recall_all@10"] for c in CATEGORIES},
        "iterations": float(np.mean([m["iterations"] for _, m in rows])),
        "p50_ms": float(np.percentile(lat, 50)), "p95_ms": float(np.percentile(lat, 95))}
    print(f"{label}: {results[label]} ({time.time() - start:.0f} s)", flush=True)
  write(results)
  argv = ["--data", args.data] if args.data != str(DEFAULT_DATA) else []
  write_record(OUT.with_suffix(".md"), "iris_ablation", argv, configs(argv))


def write(results: dict) -> None:
  single = results[CONFIGS[0][0]]
  lines = ["# IRIS on LaceMem against single-pass retrieval (LoCoMo dev, 1,584 questions)", "",
           "`python experiments/iris_ablation.py`", "",
           "Evidence Recall@10 (all) over the first 10 distinct turns of the ranked evidence; "
           "retrieval latency per question (no judge), on a 2-core CPU.", "",
           "| configuration | multi-hop R@10 | temporal R@10 | all R@5 | all R@10 | iterations "
           "| p50 ms | p95 ms |", "|---|---|---|---|---|---|---|---|"]
  for label, r in results.items():
    lines.append(f"| {label} | {r['multi-hop']:.3f} | {r['temporal']:.3f} | "
                 f"{r['overall']['recall_all@5']:.3f} | {r['overall']['recall_all@10']:.3f} | "
                 f"{r['iterations']:.2f} | {r['p50_ms']:.1f} | {r['p95_ms']:.1f} |")
  iris = results[CONFIGS[1][0]]
  lines += ["", "IRIS with the heuristic judge against single-pass: "
            f"multi-hop {iris['multi-hop'] - single['multi-hop']:+.3f}, "
            f"temporal {iris['temporal'] - single['temporal']:+.3f}; "
            f"p95 latency {iris['p95_ms'] / single['p95_ms']:.1f}x single-pass."]
  OUT.parent.mkdir(parents=True, exist_ok=True)
  write_markdown(OUT.with_suffix(".md"), lines)
  OUT.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
  print("\n".join(lines))


if __name__ == "__main__":
  main()
