"""`rmmjax embed` and `rmmjax bench`: the sentence encoder on a file of texts, and the benchmarks
(each against its reference, in one run, printing a table)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rmmjax.bench import agent as bench_agent
from rmmjax.bench import core as bench_core
from rmmjax.bench import cross as bench_cross
from rmmjax.bench import iris as bench_iris
from rmmjax.bench import retrieval as bench_retrieval
from rmmjax.bench import scaling as bench_scaling
from rmmjax.encode.cache import EmbeddingCache, cache_path
from rmmjax.encode.encoder import SentenceEncoder
from rmmjax.io.outputs import check_output_file
from rmmjax.io.workdir import atomic_path

NEEDS_DATA = {"cross": "pairs", "encode": "sentences"}  # what their LoCoMo file gives them


def cmd_embed(args) -> None:
  path = Path(args.inp)
  texts = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
  if not texts:
    raise ValueError(f"--in {path} {'is empty' if path.exists() else 'does not exist'} "
                     "(expected one text per line)")
  out = Path(args.out)
  if out.suffix != ".npy":
    raise ValueError(f"--out {out}: expected a file name ending in .npy")
  check_output_file(out, "--out")
  cache = None if args.no_cache else EmbeddingCache(args.cache or cache_path())
  encoder = SentenceEncoder(args.model, cache=cache)
  embeddings = encoder.encode(texts)
  with atomic_path(out) as tmp, open(tmp, "wb") as f:
    np.save(f, embeddings)
  print(f"wrote {out}: {embeddings.shape[0]} x {embeddings.shape[1]} ({encoder.identity})")


def cmd_bench(args) -> None:
  out = check_output_file(args.out, "--out") if args.out else None
  data = Path(args.data) if args.data else None
  if args.what in NEEDS_DATA and data is None:
    raise ValueError(f"bench {args.what} needs --data PATH (a LoCoMo file, for real "
                     f"{NEEDS_DATA[args.what]})")
  BENCHES[args.what](out, data, args)


# Each benchmark, called with (--out, --data, the parsed flags).
BENCHES = {
    "core": lambda out, data, args: bench_core.bench_core(out, quick=args.quick),
    "search": lambda out, data, args: bench_retrieval.bench_search(out, quick=args.quick),
    "encode": lambda out, data, args: bench_retrieval.bench_encode(out, data, quick=args.quick),
    "cross": lambda out, data, args: bench_cross.bench_cross(out, data, quick=args.quick),
    "agent": lambda out, data, args: bench_agent.bench_agent(out, data, quick=args.quick,
                                                             large=args.large),
    "iris": lambda out, data, args: bench_iris.bench_iris(out, data, quick=args.quick),
    "scaling": lambda out, data, args: bench_scaling.bench_scaling(out, quick=args.quick),
}


def add_parsers(sub) -> None:
  p = sub.add_parser("embed", help="embed one text per line with the sentence encoder")
  p.add_argument("--in", dest="inp", required=True, help="TEXTS.txt, one text per line")
  p.add_argument("--out", required=True, help="EMB.npy")
  p.add_argument("--model", default=None,
                 help="Hugging Face-format model directory (default: all-MiniLM-L6-v2)")
  p.add_argument("--cache", default=None, help="SQLite embedding cache (default under ~/.cache)")
  p.add_argument("--no-cache", action="store_true")
  p.set_defaults(func=cmd_embed)

  p = sub.add_parser("bench", help="benchmarks that print a table")
  p.add_argument("what", choices=tuple(BENCHES))
  p.add_argument("--data", default=None,
                 help="encode: the LoCoMo file whose turns are encoded; cross: whose questions "
                      "and turns are paired; agent: whose sessions are ingested")
  p.add_argument("--out", default=None, help="write the results as JSON")
  p.add_argument("--quick", action="store_true", help="fewer repeats (a smoke run)")
  p.add_argument("--large", action="store_true",
                 help="agent: also a bank of 1,000,000 memories (about 6.5 GB of memory, 5 minutes)")
  p.set_defaults(func=cmd_bench)
