"""`rmmjax eval`: evidence retrieval on a labelled dataset, per category, through any trained
model (a reranker, a tuned query encoder, IRIS's learned models), never on what it trained on."""

from __future__ import annotations

from pathlib import Path

import jax

from rmmjax.cli.common import add_llm_flags, llm_from_flags, plural
from rmmjax.config import EVALUABLE_DATASETS, PRECISIONS, UNITS, apply_precision
from rmmjax.eval.iris_eval import JUDGES
from rmmjax.eval.retrieval import evaluate_retrieval, format_table
from rmmjax.io.outputs import check_output_file
from rmmjax.io.workdir import atomic_write_json, refuse_if_training
from rmmjax.io.kinds import model_kind
from rmmjax.learners.loading import RERANKER_KINDS, reranker_record
from rmmjax.learners.iris.episodes import RERANK_MODES
from rmmjax.learners.iris.files import is_iris_model
from rmmjax.retrieve.iris import IRIS_PRESETS
from rmmjax.retrieve.rankers import RETRIEVERS

MAX_CUTOFF = 1000  # recall at more units than a long conversation holds measures nothing


def check_flags(args, ks: tuple[int, ...], retriever: str) -> None:
  """Refuses the first broken rule between eval's flags; flags that would change nothing are
  refused, not ignored (a ceiling asked for with --judge oracle must not come back single-pass)."""
  lace = args.units == "lace"
  # Learned IRIS models given where another model is expected (with units lace --encoder
  # takes them for their anchor encoder).
  misplaced = next((f"{flag} {path}" for flag, path in (
      ("--reranker", args.reranker), ("--encoder", None if lace else args.encoder))
                    if path and is_iris_model(Path(path))), None)
  rules = (
      (min(ks) < 1 or max(ks) > MAX_CUTOFF or len(set(ks)) != len(ks),
       f"--k {','.join(map(str, ks))}: expected distinct cut-offs from 1 to {MAX_CUTOFF:,} such "
       "as 5,10"),
      (args.judge and not args.iris,
       f"--judge {args.judge} is IRIS's sufficiency judge: pass --units lace --iris as well"),
      (args.rerank_mode and not (lace and args.iris and args.reranker),
       f"--rerank-mode {args.rerank_mode} orders IRIS's evidence with a reranker: pass --units "
       "lace --iris --reranker W_OR_FILE as well"),
      (args.retriever is None and retriever not in RETRIEVERS,
       f"the reranker {args.reranker} records its candidates' retriever as {retriever!r}, not one "
       f"of {', '.join(RETRIEVERS)}; pass --retriever"),
      (args.llm_url and args.judge != "llm",
       "--llm-url is the LLM of --judge llm: pass --iris --judge llm as well"),
      (args.judge == "llm" and not args.llm_url,
       "--judge llm needs --llm-url URL and --model NAME"),
      (args.iris and not lace,
       f"--iris retrieves from LaceMem: pass --units lace (not {args.units!r})"),
      (lace and args.budget_words,
       "--units lace evaluates LaceMem's own retrieval: --budget-words applies to the other units"),
      (args.iris_model and not args.iris,
       "--iris-model holds IRIS's learned judge and refiner: pass --units lace --iris "
       "[learned|default|wide] as well"),
      (args.iris_model and args.judge not in (None, "heuristic"),
       f"--iris-model brings its own judge: leave out --judge {args.judge}"),
      (misplaced, f"{misplaced} holds learned IRIS models (learner=iris): pass it as "
       "--iris-model (or, with --units lace, as --encoder for its anchor)"),
      (lace and args.reranker and (not args.iris or args.online),
       "a reranker over LaceMem orders the evidence IRIS gathers: pass --iris (and not --online)"),
      (args.budget_words is not None and args.budget_words < 1,
       f"--budget-words {args.budget_words}: expected a positive number of words"),
      (args.candidates is not None and (not args.reranker or lace or args.online),
       f"--candidates {args.candidates} cuts a reranker's K candidates to the base order's "
       "first N: pass --reranker, without --units lace or --online"),
      (args.online and not args.reranker,
       "--online replays a reranker's online learning: pass --reranker as well"),
      (args.in_sample and not (args.reranker or args.encoder or args.iris_model),
       "--in-sample applies to a trained model: pass --reranker, --encoder or --iris-model as "
       "well"),
      (args.allow_mismatch and not (args.reranker or args.encoder),
       "--allow-mismatch applies to a reranker or a tuned query encoder trained with other "
       "settings: pass --reranker or --encoder as well"),
      (args.encoder and retriever == "bm25",
       "--encoder tunes dense search, which --retriever bm25 does not use: pass --retriever "
       "dense or hybrid"),
  )
  if broken := next((message for rule, message in rules if rule), None):
    raise ValueError(broken)


def cmd_eval(args) -> None:
  try:
    ks = tuple(int(k) for k in args.k.split(","))
  except ValueError:
    raise ValueError(f"--k {args.k!r}: expected comma-separated integers such as 5,10") from None
  refuse_if_training(("--reranker", args.reranker), ("--encoder", args.encoder),
                     ("--iris-model", args.iris_model))
  # A reranker ranks the candidates of the retriever it trained over: that is the default.
  # (A model of another kind is refused by the evaluation, naming the flag that takes it.)
  trained_over = (reranker_record(Path(args.reranker)).get("retriever")
                  if args.reranker and model_kind(Path(args.reranker)) in RERANKER_KINDS
                  else None)
  retriever = args.retriever or trained_over or ("hybrid" if args.units == "lace" else "bm25")
  check_flags(args, ks, retriever)
  if args.out:
    check_output_file(args.out, "--out")
  apply_precision(args.precision)
  result = evaluate_retrieval(args.dataset, Path(args.data), args.units, retriever, ks,
                              args.budget_words, reranker=args.reranker, online=args.online,
                              in_sample=args.in_sample, allow_mismatch=args.allow_mismatch,
                              progress=not args.quiet, query_encoder=args.encoder,
                              iris=args.iris, judge=args.judge or "heuristic",
                              llm=llm_from_flags(args), rerank_mode=args.rerank_mode or "fused",
                              iris_model=args.iris_model, candidates=args.candidates)
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
    if config.get("compute_dtype"):
      print(f"the cross reranker scored in {config['compute_dtype']} on "
            f"{jax.default_backend()}")
    step, planned = config["reranker_step"], config["reranker_steps_planned"]
    if planned is not None and step < planned:
      print(f"NOTE: {args.reranker} has trained {step} of its {planned} steps (interrupted or "
            f"still running): these are the numbers of step {step}")
  if config["without_questions"]:  # (nothing to measure there; said, so counts add up)
    print(f"left out {plural(len(config['without_questions']), 'conversation')} without "
          f"evidence-labelled questions: {', '.join(config['without_questions'])}")
  print(format_table(result, ks))
  if "base_order" in result:
    print(f"\nthe {retriever} order the reranker reranks, over the same candidates:\n"
          + format_table(result | {"metrics": result["base_order"]}, ks))
    ceiling = result["ceiling"]
    print(f"\nceiling, the best order of the same K = {ceiling['k']} candidates (it uses the "
          "labels):\n" + format_table(result | {"metrics": ceiling}, ks))
    print(f"ceiling, every evidence unit among the K = {ceiling['k']} candidates (R all): "
          f"overall {ceiling['overall']['ceiling']:.3f}; " + ", ".join(
              f"{c} {m['ceiling']:.3f}" for c, m in ceiling["by_category"].items()))
  counts = result["load_report"]["counts"]
  if counts:
    print("\nrepairs and drops while loading: " + "; ".join(f"{k}: {v}" for k, v in
                                                          sorted(counts.items())))
  if args.out:
    atomic_write_json(Path(args.out), result)
    print(f"\nwrote {args.out}")


def add_parser(sub) -> None:
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
  add_llm_flags(p, what="with --judge llm: the sufficiency judge")
  p.add_argument("--retriever", default=None, choices=RETRIEVERS,
                 help="default: the one --reranker trained over; else bm25, and hybrid for "
                      "--units lace")
  p.add_argument("--k", default="5,10", help="distinct recall cut-offs, comma-separated")
  p.add_argument("--budget-words", type=int, default=None,
                 help="also report recall of units taken in rank order up to this many words")
  p.add_argument("--reranker", default=None,
                 help="a training workdir, an exported .safetensors or an exported cross "
                      "reranker's directory: rerank the K candidates (conversations it trained "
                      "on are left out; a two-stage run brings its query encoder)")
  anchor = p.add_mutually_exclusive_group()  # learned IRIS models bring their anchor encoder
  anchor.add_argument("--iris-model", default=None,
                      help="with --units lace --iris: a learner=iris workdir or its export "
                           "(learned judge, refinement and anchor encoders); --iris learned "
                           "suits it")
  anchor.add_argument("--encoder", default=None,
                      help="a tuned query encoder (a learner=query_encoder workdir or its export; "
                           "with --units lace also a learner=iris workdir, for its anchor "
                           "encoder) for the questions of dense search")
  p.add_argument("--candidates", type=int, default=None,
                 help="with a cross reranker: it reads the base order's first N of its K "
                      "candidates, the rest follow in the base order (a cheaper cascade)")
  p.add_argument("--online", action="store_true",
                 help="with --reranker: replay each conversation prequentially, learning online")
  p.add_argument("--in-sample", action="store_true",
                 help="with --reranker, --encoder or --iris-model: keep the conversations it "
                      "trained on (in-sample numbers)")
  p.add_argument("--allow-mismatch", action="store_true",
                 help="with --reranker: evaluate although its units, retriever or encoder differ "
                      "(the report lists the mismatches)")
  p.add_argument("--precision", default="highest", choices=PRECISIONS,
                 help="float32 matmul precision (default: highest, full float32)")
  p.add_argument("--quiet", action="store_true", help="no progress bars")
  p.add_argument("--out", default=None, help="write the metrics as JSON")
  p.set_defaults(func=cmd_eval)
