"""The memory commands of the `rmmjax` command line: ingest, recall, chat, answer, memory.

Each handler turns flags into library calls (rmmjax.memory, rmmjax.agent, rmmjax.eval); the
parser lives here too so rmmjax/cli.py stays one screen of commands. The chat loop is in
cli_chat.py, the whole-user commands (export, import, delete) in cli_bank.py, what they share
(the bank, the encoder, the LLM from flags) in cli_common.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rmmjax.cli_common import bank, encoder_for, llm_from_flags as _llm


def _agent(args, memory_bank, encoder, learn: bool, m: int, llm=None, workdir=None):
  from rmmjax.agent import Agent, AgentSettings
  from rmmjax.io.reranker_load import load_reranker
  from rmmjax.replay.query_encoder import load_query_encoder
  args.retriever = args.retriever or "hybrid"
  args.candidates = 20 if args.candidates is None else args.candidates
  if args.candidates < 1:
    raise ValueError(f"--candidates {args.candidates}: expected a positive number of memories "
                     f"to retrieve")
  if m > args.candidates:
    raise ValueError(f"{m} memories handed to the LLM (--{'k' if args.command == 'recall' else 'm'}"
                     f" {m}) but only --candidates {args.candidates} retrieved: hand over at "
                     f"most as many as are retrieved")
  reranker = load_reranker(Path(args.reranker)) if args.reranker else None
  query_encoder = load_query_encoder(Path(args.encoder), encoder) if args.encoder else None
  extra = {"tau": args.tau, "lr": args.lr} if args.command == "chat" else {}
  settings = AgentSettings(retriever=args.retriever, k=args.candidates, m=m,
                           batch=getattr(args, "batch", 4), learn=learn, **extra)
  agent = Agent(memory_bank, encoder, settings, llm=llm, workdir=workdir, reranker=reranker,
                # queries are embedded afresh: they are never written to the embedding cache
                query_encoder=query_encoder or encoder.with_cache(None),
                allow_mismatch=args.allow_mismatch)
  for mismatch in agent.mismatches:
    print(f"warning: the reranker does not fit ({mismatch}); used anyway (--allow-mismatch)",
          file=sys.stderr)
  return agent


def _iris_agent(args, memory_bank, encoder, m: int, llm=None):
  """The agent answering through IRIS over the user's LaceMem (recall --iris, chat --iris)."""
  from rmmjax.agent_iris import IrisAgent
  from rmmjax.replay.iris_model_io import load_iris_model
  from rmmjax.retrieve.iris import IRIS_PRESETS
  for flag, value in (("--reranker", args.reranker), ("--encoder", args.encoder),
                      ("--workdir", getattr(args, "workdir", None)),
                      ("--retriever", args.retriever), ("--candidates", args.candidates),
                      ("--allow-mismatch", args.allow_mismatch)):
    if value:
      raise ValueError(f"{flag} {value}: {args.command} --iris retrieves through IRIS over the "
                       f"user's LaceMem (hybrid search, budgets from --iris-settings), which "
                       f"takes its models from --iris-model (a learner=iris workdir or its "
                       f"export); drop {flag}")
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


def cmd_ingest(args) -> None:
  from rmmjax.data.locomo import load_locomo
  from rmmjax.data.msc import load_msc
  from rmmjax.memory.ingest import IngestStopped, ingest_conversations, plan_ingest
  from rmmjax.memory.reflection import LLMReflector, OfflineReflector
  if not args.user and not args.user_per_conversation:
    raise ValueError("name whose memories these are: --user U, or --user-per-conversation")
  conversations, report = {"locomo": load_locomo, "msc": load_msc}[args.dataset](Path(args.data))
  plan_ingest(conversations, args.user, args.user_per_conversation)  # before the bank exists
  llm = _llm(args)
  with bank(args.db, must_exist=False) as memory_bank:
    encoder = encoder_for(memory_bank)
    offline = OfflineReflector(encoder)
    reflector = (offline if llm is None else
                 LLMReflector(llm, fallback=offline if args.fallback == "offline" else None))
    try:
      counts = ingest_conversations(memory_bank, conversations, reflector, encoder,
                                    user=args.user,
                                    user_per_conversation=args.user_per_conversation,
                                    progress=not args.quiet)
    except IngestStopped as err:
      print(json.dumps(err.counts, indent=2), file=sys.stderr)
      raise
    if args.lace:  # each user's layered memory, for recall --iris and chat --iris
      from rmmjax.memory.lace_sync import synced_lace
      users = ([c.conversation_id for c in conversations] if args.user_per_conversation
               else [args.user])
      counts["lace_turns_added"] = sum(
          synced_lace(memory_bank, user, encoder, progress=not args.quiet)[1]
          for user in dict.fromkeys(users))
  if llm is not None:
    counts["cut_prompts"] = reflector.cut_prompts
  print(json.dumps(counts, indent=2, default=str))
  if llm is not None and counts["fallbacks"]:
    print(f"{counts['fallbacks']} LLM replies were unusable: their topics came from the offline "
          f"reflector (a topic list) or were added as new memories (a merge decision)")
  if counts.get("cut_prompts") or counts["cut_summaries"]:
    print(f"text was cut to fit: {counts.get('cut_prompts', 0)} prompts (--context-tokens), "
          f"{counts['cut_summaries']} memory summaries")
  if report.counts:
    print("repairs and drops while loading: " + "; ".join(
        f"{k}: {v}" for k, v in sorted(report.counts.items())))


def cmd_recall(args) -> None:
  if args.k < 1:
    raise ValueError(f"--k {args.k}: expected a positive number of memories")
  _check_iris_flags(args)
  with bank(args.db, must_exist=True) as memory_bank:
    if not memory_bank.has_user(args.user):
      raise ValueError(f"--user {args.user!r} has no memories in {args.db}")
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
  from rmmjax.cli_chat import chat_loop
  _check_iris_flags(args)
  llm = _llm(args)
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
  from rmmjax.eval.answering import agent_answerer, evaluate_answers, iris_answerer
  from rmmjax.io.outputs import check_output_file
  from rmmjax.io.workdir import atomic_write_json
  from rmmjax.llm.base import LLMError
  check_output_file(args.out, "--out")
  if args.limit is not None and args.limit < 1:
    raise ValueError(f"--limit {args.limit}: expected a positive number of questions")
  if not args.iris and not args.db:
    raise ValueError("rmmjax answer needs --db FILE (a bank built with ingest "
                     "--user-per-conversation), or --iris to answer from LaceMem")
  llm = _llm(args)
  if llm is None:
    raise ValueError("rmmjax answer needs an LLM: --llm-url URL --model NAME")
  if args.iris:
    report = evaluate_answers(args.dataset, Path(args.data),
                              iris_answerer(encoder_for(None), llm, args.m), llm,
                              limit=args.limit, progress=not args.quiet,
                              config={"memory": "lace", "iris": True, "m": args.m})
  else:
    with bank(args.db, must_exist=True) as memory_bank:
      agent = _agent(args, memory_bank, encoder_for(memory_bank), learn=False, m=args.m, llm=llm)
      report = evaluate_answers(args.dataset, Path(args.data), agent_answerer(agent), llm,
                                limit=args.limit, progress=not args.quiet,
                                config={"memory": "bank", "retriever": args.retriever,
                                        "k": agent.settings.k, "m": args.m})
      report["agent"] = dict(agent.stats)
  atomic_write_json(Path(args.out), report)
  print(json.dumps(report["metrics"]["overall"], indent=2))
  print(f"wrote {args.out}")
  if report["stopped"]:
    raise LLMError(f"{report['stopped']}; the report of the questions answered before is in "
                   f"{args.out} (complete: false)")


def add_parsers(sub) -> None:
  """The memory commands' flags."""
  from rmmjax.retrieve.rankers import RETRIEVERS

  def llm_flags(p, required: bool = False):
    p.add_argument("--llm-url", required=required, default=None,
                   help="an OpenAI-compatible server, e.g. http://127.0.0.1:8080")
    p.add_argument("--model", default=None, help="the model name the server serves")
    p.add_argument("--api-key-env", default="RMMJAX_LLM_API_KEY",
                   help="environment variable holding the API key (never logged)")
    p.add_argument("--structured-output", default="json_schema",
                   choices=("json_schema", "json_object", "none"),
                   help="json_schema (OpenAI, vLLM), json_object (llama.cpp's server), none")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per request")
    p.add_argument("--context-tokens", type=int, default=8192,
                   help="the server's context window: prompts are cut to fit it (default 8192)")

  def iris_flags(p):
    from rmmjax.retrieve.iris import IRIS_PRESETS
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
    p.add_argument("--retriever", default=None, choices=RETRIEVERS, help="default hybrid")
    p.add_argument("--candidates", type=int, default=None, help="K memories retrieved (20)")
    p.add_argument("--reranker", default=None, help="a training workdir or exported reranker")
    p.add_argument("--encoder", default=None, help="a tuned query encoder (workdir or export)")
    p.add_argument("--allow-mismatch", action="store_true",
                   help="use a reranker trained on other units, retriever or encoder")

  p = sub.add_parser("ingest", help="build a memory bank from a dataset's sessions")
  p.add_argument("--dataset", default="locomo", choices=("locomo", "msc"))
  p.add_argument("--data", required=True)
  p.add_argument("--db", required=True, help="the SQLite memory bank (created if missing)")
  p.add_argument("--user", default=None, help="the user all conversations belong to")
  p.add_argument("--user-per-conversation", action="store_true",
                 help="each conversation's id is its own user")
  p.add_argument("--fallback", default="offline", choices=("offline", "none"),
                 help="with --llm-url: what reflects a session whose LLM topic list is unusable "
                      "(offline: the offline reflector, counted; none: stop, leaving it open)")
  p.add_argument("--lace", action="store_true",
                 help="also build each user's LaceMem (IRIS's layered memory) from their turns")
  p.add_argument("--quiet", action="store_true")
  llm_flags(p)
  p.set_defaults(func=cmd_ingest)

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
  p.add_argument("--m", type=int, default=5, help="memories shown per answer")
  p.add_argument("--batch", type=int, default=4, help="rewarded answers per reranker update")
  p.add_argument("--tau", type=float, default=0.5, help="Gumbel sampling temperature")
  p.add_argument("--lr", type=float, default=1e-4, help="the reranker's Adam learning rate")
  p.add_argument("--workdir", default=None,
                 help="where the reranker is checkpointed (every update) and resumed from")
  p.add_argument("--serve", action="store_true", help="never update the reranker")
  retrieval_flags(p)
  iris_flags(p)
  llm_flags(p)
  p.set_defaults(func=cmd_chat)

  p = sub.add_parser("answer", help="answer a dataset's questions from a bank; judge them")
  p.add_argument("--dataset", default="locomo", choices=("locomo",))
  p.add_argument("--data", required=True)
  p.add_argument("--db", default=None, help="a bank built with ingest --user-per-conversation")
  p.add_argument("--iris", action="store_true",
                 help="answer from IRIS's final evidence over a LaceMem per conversation")
  p.add_argument("--m", type=int, default=5)
  p.add_argument("--limit", type=int, default=None, help="answer at most this many questions")
  p.add_argument("--out", required=True)
  p.add_argument("--quiet", action="store_true")
  retrieval_flags(p)
  llm_flags(p)
  p.set_defaults(func=cmd_answer)
