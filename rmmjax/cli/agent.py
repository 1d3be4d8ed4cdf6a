"""`rmmjax recall`, `chat` and `answer`: an agent over a user's bank (the RMM agent, or IRIS over
their LaceMem with --iris) from flags, and what it retrieves, answers or scores."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rmmjax.agent import Agent, AgentSettings, IrisAgent
from rmmjax.cli.chat_loop import chat_loop
from rmmjax.cli.common import add_llm_flags, bank, encoder_for, llm_from_flags, plural
from rmmjax.eval.answering import BankAnswerer, IrisAnswerer, evaluate_answers
from rmmjax.encode.protocol import encoder_identity
from rmmjax.eval.retrieval import recorded_query_encoder
from rmmjax.learners.iris.files import load_iris_model
from rmmjax.io.kinds import model_kind
from rmmjax.io.outputs import check_output_file
from rmmjax.learners.query_encoder.files import load_query_encoder, query_encoder_record
from rmmjax.learners.loading import load_reranker
from rmmjax.learners.registry import learner
from rmmjax.io.workdir import atomic_write_json, refuse_if_training
from rmmjax.llm.base import LLMError
from rmmjax.retrieve.iris import IRIS_PRESETS
from rmmjax.retrieve.rankers import RETRIEVERS

SETTINGS = AgentSettings()  # the agent's defaults are the flags' defaults


def _positive(**flags) -> None:
  """Refuses a count flag (--k, --m, --candidates, --limit) below 1; None is not given."""
  for flag, value in flags.items():
    if value is not None and value < 1:
      raise ValueError(f"--{flag} {value}: expected a positive number")


def _agent(args, memory_bank, encoder, learn: bool, m: int, llm=None, workdir=None):
  refuse_if_training(("--reranker", args.reranker), ("--encoder", args.encoder))
  args.retriever = args.retriever or SETTINGS.retriever
  reranker = load_reranker(Path(args.reranker)) if args.reranker else None
  frozen = learner(reranker.spec.variant).served_frozen if reranker is not None else None
  if args.command == "chat" and args.learn_cross and (frozen is None or args.serve):
    raise ValueError("--learn-cross lets a cross reranker (--reranker) learn from the "
                     "citations" + (", and --serve says never to learn: pass one of them"
                                    if args.serve else ": pass a cross reranker's workdir or "
                                    "export as --reranker"))
  # A reranker scores as many candidates as it trained on: by default, that many.
  default_k = reranker.spec.k if reranker is not None else SETTINGS.k
  args.candidates = default_k if args.candidates is None else args.candidates
  _positive(candidates=args.candidates)
  if m > args.candidates:
    raise ValueError(f"{m} memories handed to the LLM (--{'k' if args.command == 'recall' else 'm'}"
                     f" {m}) but only --candidates {args.candidates} retrieved: hand over at "
                     f"most as many as are retrieved")
  encoder_path = args.encoder
  if reranker is not None and not encoder_path and reranker.record.get("query_encoder_path"):
    # Its candidates came from a tuned query encoder: the one its workdir or export holds.
    encoder_path = recorded_query_encoder(Path(args.reranker), reranker.record)
  query_encoder = load_query_encoder(Path(encoder_path), encoder) if encoder_path else None
  # The trained models the agent uses, for the report and what answer may evaluate on.
  # (a plain Hugging Face encoder given as --encoder trained on nothing here)
  tuned = encoder_path and model_kind(Path(encoder_path)) in ("query encoder",
                                                               "query encoder export")
  args.used = {"reranker": str(Path(reranker.source).resolve()) if reranker is not None else None,
               "reranker_record": reranker.record if reranker is not None else None,
               "query_encoder": str(Path(encoder_path).resolve()) if encoder_path else None,
               "query_encoder_record": query_encoder_record(Path(encoder_path)) if tuned else None}
  extra, served = {}, False
  if args.command == "chat":
    if frozen is not None and learn and not args.learn_cross:
      learn, served = False, True
    # Such a reranker learns at its own run's online rate and temperature unless told.
    run = reranker.hparams if frozen is not None else SETTINGS
    extra = {k: float(getattr(run, k)) if getattr(args, k) is None else getattr(args, k)
             for k in ("tau", "lr")}
  settings = AgentSettings(retriever=args.retriever, k=args.candidates, m=m,
                           batch=getattr(args, "batch", SETTINGS.batch), learn=learn, **extra)
  agent = Agent(memory_bank, encoder, settings, llm=llm, workdir=workdir, reranker=reranker,
                # queries are embedded afresh: they are never written to the embedding cache
                query_encoder=query_encoder or encoder.with_cache(None),
                allow_mismatch=args.allow_mismatch)
  for mismatch in agent.mismatches:
    print(f"warning: the reranker does not fit ({mismatch}); used anyway (--allow-mismatch)",
          file=sys.stderr)
  if served:
    print(frozen, file=sys.stderr)
  return agent


def _refuse_beside_iris(args, what: str) -> None:
  """Refuses a flag that IRIS's retrieval would not use (`what` it does instead)."""
  for flag, value in (("--reranker", args.reranker), ("--encoder", args.encoder),
                      ("--workdir", getattr(args, "workdir", None)),
                      ("--db", args.db if args.command == "answer" else None),
                      ("--in-sample", getattr(args, "in_sample", False)),
                      ("--retriever", args.retriever), ("--candidates", args.candidates),
                      ("--allow-mismatch", args.allow_mismatch)):
    if value not in (None, False):  # (an empty path or a 0 given is still given)
      raise ValueError(f"{flag}{'' if value is True else f' {value}'}: {args.command} --iris "
                       f"{what}; drop {flag}")


def _iris_agent(args, memory_bank, encoder, m: int, llm=None):
  """The agent answering through IRIS over the user's LaceMem (recall --iris, chat --iris)."""
  _refuse_beside_iris(args, "retrieves through IRIS over the user's LaceMem (hybrid search, "
                            "budgets from --iris-settings), which takes its models from "
                            "--iris-model (a learner=iris workdir or its export)")
  model = load_iris_model(Path(args.iris_model), encoder) if args.iris_model else None
  preset = args.iris_settings or ("learned" if model is not None else "default")
  return IrisAgent(memory_bank, encoder, m=m, llm=llm, settings=IRIS_PRESETS[preset],
                   model=model, progress=True, rebuild=args.rebuild_lace)


def _check_iris_flags(args) -> None:
  if not args.iris:
    for flag, value in (("--iris-model", args.iris_model), ("--iris-settings", args.iris_settings),
                        ("--rebuild-lace", args.rebuild_lace)):
      if value:
        raise ValueError(f"{flag} applies to IRIS over the user's LaceMem: pass --iris as well")


def cmd_recall(args) -> None:
  _positive(k=args.k)
  _check_iris_flags(args)
  with bank(args.db, must_exist=True) as memory_bank:
    if args.iris:
      agent = _iris_agent(args, memory_bank, encoder_for(memory_bank), args.k)
      _print_iris_recall(*agent.recall(args.user, args.query), args.k, args.json)
      return
    agent = _agent(args, memory_bank, encoder_for(memory_bank), learn=False, m=args.k)
    memories, scores = agent.recall(args.user, args.query)
  out = [{"memory_id": m.id, "score": s, "summary": m.summary,
          "snippets": [{"turn_id": p.turn_id, "session": p.session_id, "date": p.date,
                        "text": p.text} for p in m.snippets]} for m, s in zip(memories, scores)]
  if args.json:
    print(json.dumps(out, indent=2))
    return
  for i, item in enumerate(out, 1):
    print(f"[{i}] (memory {item['memory_id']}, score {item['score']:.3f}) {item['summary']}")
    for p in item["snippets"]:
      print(f"      {p['turn_id']} [{p['date']}] {p['text']}")


def _print_iris_recall(result, store, k: int, as_json: bool) -> None:
  if result is None:
    print("(the user has no turns to search yet)")
    return
  out = {"label": result.label, "confidence": result.confidence,
         "iterations": result.iterations, "abstained": result.abstained,
         "turns": [{"turn_id": r.turn_id, "session": r.session_id, "date": r.date,
                    "speaker": r.speaker, "text": r.text, "facts": [
                        f.text for f in result.facts if f.turn_id == r.turn_id]}
                   for r in (store.raw(t) for t in result.top_turns(k))]}
  if as_json:
    print(json.dumps(out, indent=2))
    return
  print(f"IRIS: {result.label} (confidence {result.confidence:.2f}) after {result.iterations} "
        f"iteration(s)" + ("; abstained: the evidence was judged missing" if result.abstained
                           else ""))
  for i, turn in enumerate(out["turns"], 1):
    print(f"[{i}] {turn['turn_id']} [{turn['date']}] {turn['speaker']}: {turn['text']}")


def cmd_chat(args) -> None:
  _positive(m=args.m, batch=args.batch)
  _check_iris_flags(args)
  llm = llm_from_flags(args)
  if not args.new_user and not Path(args.db).is_file():
    raise FileNotFoundError(f"--db {args.db} does not exist: build one with rmmjax ingest, or "
                            f"pass --new-user to start a bank with a new user")
  with bank(args.db, must_exist=False) as memory_bank:
    if not memory_bank.has_user(args.user):
      if not args.new_user:
        users = memory_bank.users()
        raise ValueError(f"--user {args.user!r} is not in {args.db} (its users: "
                         f"{', '.join(users[:8]) or 'none'}{'...' if len(users) > 8 else ''}); "
                         f"pass --new-user to start a new user")
      memory_bank.add_user(args.user, exist_ok=True)
    if args.iris:
      agent = _iris_agent(args, memory_bank, encoder_for(memory_bank), args.m, llm)
      agent.store(args.user)  # built or brought up to date before the first question
    else:
      agent = _agent(args, memory_bank, encoder_for(memory_bank), learn=not args.serve,
                     m=args.m, llm=llm, workdir=Path(args.workdir) if args.workdir else None)
    chat_loop(agent, args.user, sys.stdin, llm is not None)


def cmd_answer(args) -> None:
  check_output_file(args.out, "--out")
  if args.iris:
    _refuse_beside_iris(args, "answers from IRIS's evidence over a LaceMem it builds from each "
                              "conversation of --data, with the base encoder and no reranker "
                              "(a reranker answers from a bank: --db BANK --reranker W)")
  _positive(m=args.m, limit=args.limit)
  if not args.iris and not args.db:
    raise ValueError("rmmjax answer needs --db FILE (a bank built with ingest "
                     "--user-per-conversation), or --iris to answer from LaceMem")
  if args.in_sample and not (args.reranker or args.encoder):
    raise ValueError("--in-sample applies to a trained model: pass --reranker or --encoder as "
                     "well")
  llm = llm_from_flags(args)
  if llm is None:
    raise ValueError("rmmjax answer needs an LLM: --llm-url URL --model NAME")
  if args.iris:
    report = evaluate_answers(args.dataset, Path(args.data),
                              IrisAnswerer(encoder_for(None), llm, args.m), llm,
                              limit=args.limit, progress=not args.quiet,
                              config={"memory": "lace", "iris": True, "m": args.m})
  else:
    with bank(args.db, must_exist=True) as memory_bank:
      agent = _agent(args, memory_bank, encoder_for(memory_bank), learn=False, m=args.m, llm=llm)
      used = args.used
      models = [(used[key], used[f"{key}_record"]) for key in ("reranker", "query_encoder")
                if used[f"{key}_record"] is not None]
      report = evaluate_answers(args.dataset, Path(args.data), BankAnswerer(agent), llm,
                                limit=args.limit, progress=not args.quiet,
                                config={"memory": "bank", "retriever": args.retriever,
                                        "k": agent.settings.k, "m": args.m,
                                        "encoder": encoder_identity(agent.encoder),
                                        "query_encoder_identity": agent.tuned_query_encoder,
                                        "mismatches": agent.mismatches} | used,
                                models=models, in_sample=args.in_sample)
      report["agent"] = dict(agent.stats)
      left_out = report["config"].get("excluded_conversations")
      if left_out:
        print(f"left out {plural(len(left_out), 'conversation')} the models trained on: "
              f"{', '.join(left_out)}")
      elif report["config"].get("trained_conversations_in_file"):
        print("IN-SAMPLE: " + ", ".join(report["config"]["trained_conversations_in_file"])
              + " were trained on")
  atomic_write_json(Path(args.out), report)
  print(json.dumps(report["metrics"]["overall"], indent=2))
  print(f"wrote {args.out}")
  if report["stopped"]:
    raise LLMError(f"{report['stopped']}; the report of the questions answered before is in "
                   f"{args.out} (complete: false)")


def add_parsers(sub) -> None:
  def iris_flags(p):
    p.add_argument("--iris", action="store_true",
                   help="retrieve through IRIS over the user's LaceMem (built from the user's "
                        "turns in the bank when missing, then kept up to date)")
    p.add_argument("--iris-settings", default=None, choices=tuple(IRIS_PRESETS),
                   help="with --iris: IRIS's settings (default: learned with --iris-model, "
                        "else default)")
    p.add_argument("--iris-model", default=None,
                   help="with --iris: a learner=iris workdir or its export (anchor and "
                        "refinement encoders, learned judge)")
    p.add_argument("--rebuild-lace", action="store_true",
                   help="with --iris: build the user's LaceMem afresh from their turns")

  def retrieval_flags(p):
    p.add_argument("--retriever", default=None, choices=RETRIEVERS,
                   help=f"default {SETTINGS.retriever}")
    p.add_argument("--candidates", type=int, default=None,
                   help=f"K memories retrieved ({SETTINGS.k})")
    p.add_argument("--reranker", default=None, help="a training workdir or exported reranker")
    p.add_argument("--encoder", default=None, help="a tuned query encoder (workdir or export)")
    p.add_argument("--allow-mismatch", action="store_true",
                   help="use a reranker trained on other units, retriever or encoder")

  p = sub.add_parser("recall", help="print the memories that would be handed to the LLM")
  p.add_argument("--db", required=True)
  p.add_argument("--user", required=True)
  p.add_argument("--k", type=int, default=5, help="memories handed to the LLM")
  p.add_argument("--json", action="store_true")
  retrieval_flags(p)
  iris_flags(p)
  p.add_argument("query")
  p.set_defaults(func=cmd_recall)

  p = sub.add_parser("chat", help="talk with the agent (stdin); /end reflects the session")
  p.add_argument("--db", required=True)
  p.add_argument("--user", required=True)
  p.add_argument("--new-user", action="store_true",
                 help="start the user (and the bank file) if the bank does not have them")
  p.add_argument("--m", type=int, default=SETTINGS.m, help="memories shown per answer")
  p.add_argument("--batch", type=int, default=SETTINGS.batch,
                 help="rewarded answers per reranker update")
  p.add_argument("--tau", type=float, default=None,
                 help=f"Gumbel sampling temperature (default {SETTINGS.tau}; a cross reranker's "
                      "run's own)")
  p.add_argument("--lr", type=float, default=None,
                 help=f"the reranker's Adam learning rate (default {SETTINGS.lr}; a cross "
                      "reranker's run's own)")
  p.add_argument("--learn-cross", action="store_true",
                 help="let a cross reranker learn from the citations (off by default: no rate "
                      "measured for it helps)")
  p.add_argument("--workdir", default=None,
                 help="where the reranker is checkpointed (every update) and resumed from")
  p.add_argument("--serve", action="store_true", help="never update the reranker")
  retrieval_flags(p)
  iris_flags(p)
  add_llm_flags(p)
  p.set_defaults(func=cmd_chat)

  p = sub.add_parser("answer", help="answer a dataset's questions from a bank; judge them")
  p.add_argument("--dataset", default="locomo", choices=("locomo",))
  p.add_argument("--data", required=True)
  p.add_argument("--db", default=None, help="a bank built with ingest --user-per-conversation")
  p.add_argument("--iris", action="store_true",
                 help="answer from IRIS's final evidence over a LaceMem per conversation")
  p.add_argument("--m", type=int, default=SETTINGS.m, help="memories shown per answer")
  p.add_argument("--limit", type=int, default=None, help="answer at most this many questions")
  p.add_argument("--in-sample", action="store_true",
                 help="answer the conversations the reranker or encoder trained on too (left "
                      "out by default)")
  p.add_argument("--out", required=True)
  p.add_argument("--quiet", action="store_true")
  retrieval_flags(p)
  add_llm_flags(p)
  p.set_defaults(func=cmd_answer)
