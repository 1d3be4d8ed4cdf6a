"""Base retrievers x memory granularities on the LoCoMo dev file (no learning): turn, session,
mixed, and topic units (the memories the offline Prospective Reflection writes, session by
session, into a fresh bank per conversation).

    python experiments/retrievers_granularities.py [--data PATH]

Writes experiments/results/retrievers_granularities.md. Budget recall takes units in rank
order up to 1,000 words, so granularities compare at equal context. Its record
(retrievers_granularities.config.json, see published.py) holds no run: every row evaluates a
base retriever over a granularity, as `rmmjax eval` does, and nothing is trained, so no
configuration (rmmjax.config.Config) is made; `configs` is empty.
"""

from __future__ import annotations

import argparse
import sys

from published import write_record
from replay_common import DEFAULT_DATA, RESULTS, write_markdown
from rmmjax.encode.cache import EmbeddingCache, cache_path
from rmmjax.encode.encoder import SentenceEncoder
from rmmjax.eval.retrieval import evaluate_retrieval

BUDGET = 1000


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
  encoder = SentenceEncoder(cache=EmbeddingCache(cache_path()))
  lines = ["# Base retrievers x granularities, LoCoMo dev (8 conversations, 1,584 questions)", "",
           "`python experiments/retrievers_granularities.py`", "",
           "| units | retriever | Recall@5 (all) | Recall@10 (all) | Recall@5 (any) | NDCG@10 | "
           f"MRR | words@5 | Recall@{BUDGET} words |", "|---|---|---|---|---|---|---|---|---|"]
  for units in ("turn", "session", "mixed", "topic"):
    for retriever in ("bm25", "dense", "hybrid"):
      m = evaluate_retrieval("locomo", args.data, units, retriever, (5, 10), BUDGET,
                             encoder=encoder)["metrics"]["overall"]
      lines.append(f"| {units} | {retriever} | {m['recall_all@5']:.3f} | "
                   f"{m['recall_all@10']:.3f} | {m['recall_any@5']:.3f} | {m['ndcg@10']:.3f} | "
                   f"{m['mrr']:.3f} | {m['words@5']:.0f} | {m['recall_all@budget']:.3f} |")
      print(lines[-1], flush=True)
  RESULTS.mkdir(parents=True, exist_ok=True)
  write_markdown(RESULTS / "retrievers_granularities.md", lines)
  argv = ["--data", args.data] if args.data != str(DEFAULT_DATA) else []
  write_record(RESULTS / "retrievers_granularities.md", "retrievers_granularities", argv,
               configs(argv))


if __name__ == "__main__":
  main()
