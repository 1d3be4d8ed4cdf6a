"""The `rmmjax` command line: flags -> config -> library call."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def plural(n: int, noun: str) -> str:
  """"1 conversation", "2 conversations"."""
  return f"{n} {noun}{'' if n == 1 else 's'}"


def _config(args) -> "object":
  from rmmjax.config import apply_overrides, apply_precision, get_config
  from rmmjax.io.outputs import check_output_dir
  cfg = apply_overrides(get_config(args.config), args.set or []).validate()
  check_output_dir(args.workdir, "--workdir")
  apply_precision(cfg.precision)
  return cfg


def _cmd_train(args) -> None:
  from rmmjax.train.loop import train
  from rmmjax import distributed
  with distributed.preflight("configs"):  # a refusal on one process reaches them all
    cfg = _config(args)
  summary = train(cfg, Path(args.workdir), progress=not args.quiet)
  if not distributed.is_writer():
    print(f"process {args.process_id}: trained its share; process 0 wrote {args.workdir}")
    return
  rows = []
  if "recall_at_m_final" in summary:
    where = ("eval queries" if cfg.config == "latent" else
             f"validation: {', '.join(summary['validation_conversations'])}"
             if "validation_conversations" in summary else
             f"held-out: {', '.join(summary['heldout_conversations'])}")
    rows.append((f"recall@M of selected memories ({where})", summary["recall_at_m_base"],
                 summary["recall_at_m_final"]))
  if "recall_at_m_prequential" in summary:
    rows.append(("  learning online on the held-out conversations", summary["recall_at_m_base"],
                 summary["recall_at_m_prequential"]))
  if "recall_at_m_alone" in summary:  # units lace: "after" fuses the reranker's and IRIS's order
    rows.append(("  the reranker's order alone (not fused with IRIS's)",
                 summary["recall_at_m_base"], summary["recall_at_m_alone"]))
  rows += [("reward (first/last tenth of training)", summary["reward_first"],
            summary["reward_last"]),
           ("citation rate (first/last tenth)", summary["citation_rate_first"],
            summary["citation_rate_last"])]
  print(f"\n{'':58s}{'before':>10s}{'after':>10s}")
  for name, before, after in rows:
    print(f"{name:58s}{before:10.3f}{after:10.3f}")
  if "iris_recall_at_10" in summary:  # learner=iris: held-out Recall@10 over turns
    where = "validation" if summary.get("iris_validation") else "held-out"
    for name, key in ((f"Recall@10 ({where}), single pass, base encoder", "single_pass_base"),
                      (f"Recall@10 ({where}), single pass, tuned anchor", "single_pass_tuned")):
      print(f"{name:58s}{summary['iris_recall_at_10_' + key]:10.3f}")
    print(f"{f'Recall@10 ({where}), IRIS with the learned models':58s}"
          f"{summary['iris_recall_at_10']:10.3f}")
    if "iris_warning" in summary:
      print(f"WARNING: {summary['iris_warning']}")
  elif "recall_at_k" in summary:
    print(f"{'ceiling: recall of all K candidates':58s}{summary['recall_at_k']:10.3f}")
  if cfg.config != "latent" and cfg.holdout == 0:
    print("no conversation was held out (holdout=0): evaluate on another file with\n  "
          + eval_hint(cfg, args.workdir))
  workdir = Path(args.workdir)
  print(f"\nsummary     {workdir / 'summary.json'}\ncurves      {workdir / 'curves.png'}\n"
        f"metrics     {workdir / 'metrics.jsonl'}\ntensorboard {workdir / 'tb'}\n"
        f"checkpoints {workdir / 'checkpoints'}")


def eval_hint(cfg, workdir: str) -> str:
  """The `rmmjax eval` command that evaluates what a training run of `cfg` wrote to workdir."""
  head = f"rmmjax eval --data FILE --units {cfg.units}"
  if cfg.learner == "iris":
    return f"{head} --iris learned --iris-model {workdir}"
  if cfg.learner == "query_encoder":
    return f"{head} --retriever {cfg.retriever} --encoder {workdir}"
  if cfg.units == "lace":
    return f"{head} --iris {cfg.iris} --retriever {cfg.retriever} --reranker {workdir}"
  # learner=both: the reranker's record names its query encoder, which eval loads itself.
  return f"{head} --retriever {cfg.retriever} --reranker {workdir}"


def _cmd_sweep(args) -> None:
  from rmmjax import distributed
  from rmmjax.train import sweeps
  with distributed.preflight("configs"):  # a refusal on one process reaches them all
    cfg = _config(args)
    if args.steps is not None:
      from rmmjax.config import apply_overrides
      cfg = apply_overrides(cfg, [f"steps={args.steps}"]).validate()
    grid = sweeps.parse_grid(args.grid or [], cfg)
  result = sweeps.sweep(cfg, grid, args.seeds, Path(args.workdir), progress=not args.quiet)
  if not distributed.is_writer():
    print(f"process {args.process_id}: swept its share; process 0 wrote {args.workdir}")
    return
  keys = list(grid)
  print(f"\n{'configuration':36s}{'seeds':>6s}{'recall base':>12s}{'recall final':>13s}"
        f"{'reward first':>13s}{'reward last':>12s}")
  groups: dict[str, list] = {}
  for run in result["runs"]:
    groups.setdefault(",".join(f"{k}={run[k]}" for k in keys) or "default", []).append(run)
  for label, runs in groups.items():
    mean = {key: sum(r[key] for r in runs) / len(runs)
            for key in ("recall_at_m_base", "recall_at_m_final", "reward_first", "reward_last")}
    print(f"{label:36s}{len(runs):6d}{mean['recall_at_m_base']:12.3f}"
          f"{mean['recall_at_m_final']:13.3f}{mean['reward_first']:13.3f}"
          f"{mean['reward_last']:12.3f}")
  print(f"\nsweep.json {Path(args.workdir) / 'sweep.json'}\ncurves     "
        f"{Path(args.workdir) / 'curves.png'}\ntensorboard {Path(args.workdir) / 'tb'}")


def _cmd_export(args) -> None:
  from rmmjax.io.export import export_reranker
  from rmmjax.io.outputs import check_output_dir, check_output_file
  from rmmjax.io.workdir import read_config
  learner = read_config(Path(args.workdir)).learner
  out = Path(args.out)
  if learner == "reranker":
    check_output_file(out, "--out")
    meta = export_reranker(Path(args.workdir), out)
    print(f"wrote {out} (description in its header) and {out.with_suffix('.json')} (a readable "
          "copy)")
    print(json.dumps({k: v for k, v in meta.items() if k != "record"}, indent=2))
    return
  from rmmjax.encode.encoder import SentenceEncoder
  from rmmjax.replay.query_encoder import export_query_encoder
  check_output_dir(out, "--out")
  if learner == "iris":
    from rmmjax.replay.iris_model_io import export_iris_model
    export_iris_model(Path(args.workdir), out, SentenceEncoder())
    print(f"wrote {out}: anchor_encoder/ and refine_encoder/ (Hugging Face-format encoders of "
          "the questions) and judge.safetensors (its header says how to score it); use it as "
          "--iris-model")
    return
  if out.suffix == ".safetensors":
    raise ValueError(f"--out {out}: {args.workdir} holds a query encoder (learner={learner}); "
                     "it exports as a directory")
  workdir = Path(args.workdir)
  encoder_dir = workdir if learner == "query_encoder" else workdir / "query_encoder"
  export_query_encoder(encoder_dir, out if learner == "query_encoder" else out / "query_encoder",
                       SentenceEncoder())
  if learner == "both":
    export_reranker(workdir, out / "reranker.safetensors")
    print(f"wrote {out / 'reranker.safetensors'} (evaluate with --encoder "
          f"{out / 'query_encoder'})")
  print(f"wrote {out if learner == 'query_encoder' else out / 'query_encoder'}: a Hugging "
        "Face-format encoder for the questions (sentence-transformers loads it); the memories "
        "keep the base encoder's embeddings")


def _eval_llm(args):
  if args.judge != "llm":
    return None
  if not (args.llm_url and args.model):
    raise ValueError("--judge llm needs --llm-url URL and --model NAME")
  from rmmjax.llm.client import LLMSettings, OpenAICompatibleLLM
  return OpenAICompatibleLLM(LLMSettings(base_url=args.llm_url, model=args.model,
                                         structured_output=args.structured_output))


def _cmd_eval(args) -> None:
  from rmmjax.config import apply_precision
  from rmmjax.eval.retrieval import check_cutoffs, evaluate_retrieval, format_table, write_report
  from rmmjax.io.outputs import check_output_file
  try:
    ks = tuple(int(k) for k in args.k.split(","))
  except ValueError:
    raise ValueError(f"--k {args.k!r}: expected comma-separated integers such as 5,10") from None
  check_cutoffs(ks)
  # Flags that would change nothing are refused, not ignored: a ceiling asked for with --judge
  # oracle must not quietly come back as single-pass numbers.
  if args.judge and not args.iris:
    raise ValueError(f"--judge {args.judge} is IRIS's sufficiency judge: pass --units lace "
                     "--iris as well")
  if args.rerank_mode and not (args.units == "lace" and args.iris and args.reranker):
    raise ValueError(f"--rerank-mode {args.rerank_mode} orders IRIS's evidence with a "
                     "reranker: pass --units lace --iris --reranker W_OR_FILE as well")
  if args.out:
    check_output_file(args.out, "--out")
  apply_precision(args.precision)
  retriever = args.retriever or ("hybrid" if args.units == "lace" else "bm25")
  result = evaluate_retrieval(args.dataset, Path(args.data), args.units, retriever, ks,
                              args.budget_words, reranker=args.reranker, online=args.online,
                              in_sample=args.in_sample, allow_mismatch=args.allow_mismatch,
                              progress=not args.quiet, query_encoder=args.encoder,
                              iris=args.iris, judge=args.judge or "heuristic",
                              llm=_eval_llm(args), rerank_mode=args.rerank_mode or "fused",
                              iris_model=args.iris_model)
  config = result["config"]
  models = [f"{flag} {path}" for flag, path in (("--reranker", args.reranker),
                                                 ("--iris-model", args.iris_model),
                                                 ("--encoder", args.encoder)) if path]
  if models:
    print(f"{' and '.join(models)}{' (learning online)' if args.online else ''} on "
          f"{plural(len(config['conversations']), 'conversation')}: "
          f"{', '.join(config['conversations'])}")
    trained = config["trained_conversations_in_file"]
    if config["in_sample"]:
      print(f"IN-SAMPLE: {len(trained)} of them were trained on ({', '.join(trained)})")
    elif trained:
      print(f"left out {plural(len(trained), 'conversation')} trained on: {', '.join(trained)}")
    for mismatch in config["mismatches"]:
      print(f"MISMATCH (--allow-mismatch): {mismatch}")
  if args.reranker:
    step, planned = config["reranker_step"], config["reranker_steps_planned"]
    if planned is not None and step < planned:
      print(f"NOTE: {args.reranker} has trained {step} of its {planned} steps (interrupted or "
            f"still running): these are the numbers of step {step}")
  print(format_table(result, ks))
  counts = result["load_report"]["counts"]
  if counts:
    print("\nrepairs and drops while loading: " + "; ".join(f"{k}: {v}" for k, v in
                                                          sorted(counts.items())))
  if args.out:
    write_report(result, Path(args.out))
    print(f"\nwrote {args.out}")


def _cmd_embed(args) -> None:
  import numpy as np

  from rmmjax.encode.cache import EmbeddingCache
  from rmmjax.encode.encoder import DEFAULT_CACHE, SentenceEncoder
  from rmmjax.io.outputs import check_output_file
  path = Path(args.inp)
  if not path.exists():
    raise FileNotFoundError(f"--in {path} does not exist (expected one text per line)")
  texts = path.read_text(encoding="utf-8").splitlines()
  if not texts:
    raise ValueError(f"--in {path} is empty (expected one text per line)")
  out = Path(args.out)
  if out.suffix != ".npy":
    raise ValueError(f"--out {out}: expected a file name ending in .npy")
  check_output_file(out, "--out")
  cache = None if args.no_cache else EmbeddingCache(args.cache or DEFAULT_CACHE)
  encoder = SentenceEncoder(args.model, cache=cache)
  embeddings = encoder.encode(texts)
  out.parent.mkdir(parents=True, exist_ok=True)
  tmp = out.with_name(f".{out.name}.tmp.npy")
  np.save(tmp, embeddings)
  tmp.replace(out)
  print(f"wrote {out}: {embeddings.shape[0]} x {embeddings.shape[1]} ({encoder.identity})")


def _cmd_bench(args) -> None:
  from rmmjax.io.outputs import check_output_file
  out = check_output_file(args.out, "--out") if args.out else None
  if args.what == "core":
    from rmmjax.bench import core as bench
    bench.bench_core(out, quick=args.quick)
  elif args.what == "scaling":
    from rmmjax.bench import scaling as bench_scaling
    bench_scaling.bench_scaling(out, quick=args.quick)
  elif args.what == "iris":
    from rmmjax.bench import iris as bench_iris
    bench_iris.bench_iris(out, Path(args.data) if args.data else None, quick=args.quick)
  elif args.what == "agent":
    from rmmjax.bench import agent as bench_agent
    bench_agent.bench_agent(out, Path(args.data) if args.data else None, quick=args.quick,
                            large=args.large)
  elif args.what == "search":
    from rmmjax.bench import retrieval as bench_retrieval
    bench_retrieval.bench_search(out, quick=args.quick)
  else:
    from rmmjax.bench import retrieval as bench_retrieval
    if not args.data:
      raise ValueError("bench encode needs --data PATH (a LoCoMo file, for real sentences)")
    bench_retrieval.bench_encode(out, Path(args.data), quick=args.quick)


TRAIN_HELP = """Named configs: latent (the latent simulator; no data needed) and locomo (replay of a
LoCoMo file: --set data=PATH). Every key, its default and what it means is in
rmmjax/config.py (class Config and CONFIGS); the README's "Command line" section describes
the outputs. Running the same command again resumes the workdir."""


def build_parser() -> argparse.ArgumentParser:
  from rmmjax.cli_bank import add_parser as add_bank_parser
  from rmmjax.cli_distributed import add_flags as add_distributed_flags
  from rmmjax.cli_memory import add_parsers as add_memory_parsers
  from rmmjax.config import CONFIGS, EVALUABLE_DATASETS, PRECISIONS, UNITS
  from rmmjax.eval.iris_eval import JUDGES
  from rmmjax.replay.iris_learning import RERANK_MODES
  from rmmjax.retrieve.iris import IRIS_PRESETS
  from rmmjax.retrieve.rankers import RETRIEVERS
  parser = argparse.ArgumentParser(prog="rmmjax", description=__doc__)
  sub = parser.add_subparsers(dest="command", required=True)

  def with_config(p):
    p.add_argument("--config", default="latent", choices=sorted(CONFIGS),
                   help="named config (default: latent)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a config value (repeatable); keys and defaults: "
                        "rmmjax/config.py")
    p.add_argument("--workdir", required=True, help="where outputs and checkpoints go")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    add_distributed_flags(p)

  p = sub.add_parser("train", help="train a reranker (resumes from the workdir)",
                     description=TRAIN_HELP)
  with_config(p)
  p.set_defaults(func=_cmd_train)

  p = sub.add_parser("sweep", help="run a grid x seeds as one vmapped program")
  with_config(p)
  p.add_argument("--grid", action="append", metavar="KEY=V1,V2,...",
                 help="a sweepable key and its values (repeatable)")
  p.add_argument("--seeds", type=int, default=1, help="seeds per grid point")
  p.add_argument("--steps", type=int, default=None, help="steps per run (overrides config)")
  p.set_defaults(func=_cmd_sweep)

  p = sub.add_parser("export", help="write a trained reranker (safetensors) or query encoder "
                                    "(a Hugging Face-format directory)")
  p.add_argument("--workdir", required=True)
  p.add_argument("--out", required=True,
                 help="reranker: FILE.safetensors (FILE.json goes beside it); query encoder: DIR; "
                      "both: DIR (DIR/reranker.safetensors and DIR/query_encoder)")
  p.set_defaults(func=_cmd_export)

  p = sub.add_parser("embed", help="embed one text per line with the sentence encoder")
  p.add_argument("--in", dest="inp", required=True, help="TEXTS.txt, one text per line")
  p.add_argument("--out", required=True, help="EMB.npy")
  p.add_argument("--model", default=None,
                 help="Hugging Face-format model directory (default: all-MiniLM-L6-v2)")
  p.add_argument("--cache", default=None, help="SQLite embedding cache (default under ~/.cache)")
  p.add_argument("--no-cache", action="store_true")
  p.set_defaults(func=_cmd_embed)

  p = sub.add_parser("eval", help="evidence retrieval metrics on a labelled dataset")
  p.add_argument("--dataset", default="locomo", choices=EVALUABLE_DATASETS,
                 help="a dataset with evidence-labelled questions")
  p.add_argument("--data", required=True, help="path to the dataset file")
  p.add_argument("--units", default="turn", choices=UNITS + ("lace",),
                 help="memory units; lace: LaceMem's atomic facts (with --iris: IRIS)")
  p.add_argument("--iris", nargs="?", const="default", default=None,
                 choices=tuple(IRIS_PRESETS),
                 help="with --units lace: iterative retrieval via insufficiency signals, with "
                      "EviMem's settings (default) or wider budgets that stop only on EXACT")
  p.add_argument("--rerank-mode", default=None, choices=RERANK_MODES,
                 help="with --units lace --iris --reranker: the reranker's order fused with "
                      "IRIS's own (the default), or alone")
  p.add_argument("--judge", default=None, choices=JUDGES,
                 help="with --iris: IRIS's sufficiency judge (default heuristic; oracle knows "
                      "the evidence labels: a ceiling)")
  p.add_argument("--llm-url", default=None, help="with --judge llm: an OpenAI-compatible server")
  p.add_argument("--model", default=None, help="with --judge llm: the served model")
  p.add_argument("--structured-output", default="json_schema",
                 choices=("json_schema", "json_object", "none"))
  p.add_argument("--retriever", default=None, choices=RETRIEVERS,
                 help="default: bm25, and hybrid for --units lace")
  p.add_argument("--k", default="5,10", help="distinct recall cut-offs, comma-separated")
  p.add_argument("--budget-words", type=int, default=None,
                 help="also report recall of units taken in rank order up to this many words")
  p.add_argument("--reranker", default=None,
                 help="a training workdir or exported .safetensors: rerank the K candidates "
                      "(conversations it trained on are left out)")
  p.add_argument("--iris-model", default=None,
                 help="with --units lace --iris: a learner=iris workdir or its export (learned "
                      "judge, refinement and anchor encoders); --iris learned suits it")
  p.add_argument("--encoder", default=None,
                 help="a tuned query encoder (a learner=query_encoder workdir or its export; with "
                      "--units lace also a learner=iris workdir, for its anchor encoder) "
                      "for the questions of dense search")
  p.add_argument("--online", action="store_true",
                 help="with --reranker: replay each conversation prequentially, learning online")
  p.add_argument("--in-sample", action="store_true",
                 help="with --reranker: keep the conversations it trained on (in-sample numbers)")
  p.add_argument("--allow-mismatch", action="store_true",
                 help="with --reranker: evaluate although its units, retriever or encoder differ "
                      "(the report lists the mismatches)")
  p.add_argument("--precision", default="highest", choices=PRECISIONS,
                 help="float32 matmul precision (default: highest, full float32)")
  p.add_argument("--quiet", action="store_true", help="no progress bars")
  p.add_argument("--out", default=None, help="write the metrics as JSON")
  p.set_defaults(func=_cmd_eval)

  add_memory_parsers(sub)
  add_bank_parser(sub)

  p = sub.add_parser("bench", help="benchmarks that print a table")
  p.add_argument("what", choices=["core", "search", "encode", "agent", "iris", "scaling"])
  p.add_argument("--data", default=None,
                 help="encode: the LoCoMo file whose turns are encoded; agent: whose sessions "
                      "are ingested")
  p.add_argument("--out", default=None, help="write the results as JSON")
  p.add_argument("--quick", action="store_true", help="fewer repeats (a smoke run)")
  p.add_argument("--large", action="store_true",
                 help="agent: also a bank of 1,000,000 memories (about 6.5 GB of memory, 5 minutes)")
  p.set_defaults(func=_cmd_bench)
  return parser


NOTHING = "nothing was written"
# What an interrupted command leaves (chat says it itself: what it kept depends on the session).
INTERRUPTED = {"train": "rerun the same command to resume",
               "ingest": "the sessions reflected before are kept; rerun the same command to "
                         "resume",
               "memory": "a write is one transaction: the bank is as it was, or holds all of it"}


def main(argv: list[str] | None = None) -> int:
  from rmmjax import cli_signals
  cli_signals.install()  # first: the imports below take seconds, and Ctrl-C may come in them
  argv = sys.argv[1:] if argv is None else list(argv)
  command = next((a for a in argv if not a.startswith("-")), "rmmjax")
  try:
    return _main(argv)
  except KeyboardInterrupt:
    print(f"\nrmmjax {command}: interrupted; {INTERRUPTED.get(command, NOTHING)}",
          file=sys.stderr)
    return 130


def _main(argv: list[str]) -> int:
  from rmmjax.cli_distributed import start_runtime
  from rmmjax.llm.base import LLMError
  try:
    start_runtime(argv)
  except ValueError as err:
    print(f"rmmjax: error: {err}", file=sys.stderr)
    return 2
  args = build_parser().parse_args(argv)
  try:
    args.func(args)
  except (ValueError, FileNotFoundError, PermissionError, IsADirectoryError,
          FloatingPointError) as err:
    print(f"rmmjax {args.command}: error: {err}", file=sys.stderr)
    return 2
  except LLMError as err:  # the server failed, after its retries: not a bad argument
    print(f"rmmjax {args.command}: the LLM failed: {err}", file=sys.stderr)
    return 1
  except BrokenPipeError:  # the reader of stdout left (`| head`): nothing more to say
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
