"""The memory commands of the `rmmjax` command line: ingest, recall, chat, answer.

Each handler turns flags into library calls (rmmjax.memory, rmmjax.agent, rmmjax.eval); the
parser lives here too so rmmjax/cli.py stays one screen of commands.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _llm(args):
  """The LLM backend the flags name, or None without --llm-url."""
  if not args.llm_url:
    return None
  if not args.model:
    raise ValueError("--llm-url needs --model NAME (the model the server serves)")
  from rmmjax.llm.client import LLMSettings, OpenAICompatibleLLM
  return OpenAICompatibleLLM(LLMSettings(base_url=args.llm_url, model=args.model,
                                         api_key_env=args.api_key_env,
                                         structured_output=args.structured_output,
                                         timeout_s=args.timeout))


def _bank(path: str, must_exist: bool):
  from rmmjax.memory import MemoryBank, key_from_env
  if must_exist and not Path(path).is_file():
    raise FileNotFoundError(f"--db {path} does not exist (build one with rmmjax ingest)")
  return MemoryBank(path, key=key_from_env())


def _encoder():
  from rmmjax.encode.cache import EmbeddingCache
  from rmmjax.encode.encoder import DEFAULT_CACHE, SentenceEncoder
  return SentenceEncoder(cache=EmbeddingCache(DEFAULT_CACHE))


def _agent(args, bank, encoder, learn: bool, m: int, llm=None, workdir=None):
  from rmmjax.agent import Agent, AgentSettings
  from rmmjax.io.reranker_load import load_reranker
  from rmmjax.replay.query_encoder import load_query_encoder
  reranker = load_reranker(Path(args.reranker)) if args.reranker else None
  query_encoder = load_query_encoder(Path(args.encoder), encoder) if args.encoder else None
  settings = AgentSettings(retriever=args.retriever, k=max(args.candidates, m), m=m,
                           batch=getattr(args, "batch", 4), learn=learn)
  return Agent(bank, encoder, settings, llm=llm, workdir=workdir, reranker=reranker,
               query_encoder=query_encoder)


def cmd_ingest(args) -> None:
  from rmmjax.data.locomo import load_locomo
  from rmmjax.data.msc import load_msc
  from rmmjax.memory.ingest import ingest_conversations
  from rmmjax.memory.reflection import LLMReflector, OfflineReflector
  if not args.user and not args.user_per_conversation:
    raise ValueError("name whose memories these are: --user U, or --user-per-conversation")
  conversations, report = {"locomo": load_locomo, "msc": load_msc}[args.dataset](Path(args.data))
  llm = _llm(args)
  encoder = _encoder()
  reflector = LLMReflector(llm) if llm is not None else OfflineReflector(encoder)
  with _bank(args.db, must_exist=False) as bank:
    counts = ingest_conversations(bank, conversations, reflector, encoder, user=args.user,
                                  user_per_conversation=args.user_per_conversation,
                                  progress=not args.quiet)
  print(json.dumps(counts, indent=2, default=str))
  if report.counts:
    print("repairs and drops while loading: " + "; ".join(
        f"{k}: {v}" for k, v in sorted(report.counts.items())))


def cmd_recall(args) -> None:
  if args.k < 1:
    raise ValueError(f"--k {args.k}: expected a positive number of memories")
  encoder = _encoder()
  with _bank(args.db, must_exist=True) as bank:
    if not bank.has_user(args.user):
      raise ValueError(f"--user {args.user!r} has no memories in {args.db}")
    agent = _agent(args, bank, encoder, learn=False, m=args.k)
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


def cmd_chat(args) -> None:
  llm = _llm(args)
  encoder = _encoder()
  with _bank(args.db, must_exist=False) as bank:
    agent = _agent(args, bank, encoder, learn=not args.serve, m=args.m, llm=llm,
                   workdir=Path(args.workdir) if args.workdir else None)
    print(f"chatting as {args.user}; /end ends the session (reflection), /quit leaves"
          + ("" if llm else "; no LLM: showing the memories that would be handed to one"),
          file=sys.stderr)
    for line in sys.stdin:
      text = line.strip()
      if not text:
        continue
      if text == "/quit":
        break
      if text == "/end":
        report = agent.end_session(args.user)
        print(f"session reflected: {report}")
        continue
      response = agent.respond(args.user, text)
      if response.answer is not None:
        print(response.answer)
        if response.cited:
          print("  cited: " + ", ".join(f"[{i + 1}]" for i in response.cited))
      else:
        for i, memory in enumerate(response.memories, 1):
          print(f"[{i}] {memory.summary}")
    agent.save()
    stats = agent.stats
    print(f"reranker updates: {stats['updates']}; queries {stats['queries']}, cited "
          f"{stats['cited']} of {stats['shown']} shown, malformed replies {stats['malformed']}, "
          f"invalid citations {stats['invalid_citations']}, LLM errors {stats['llm_errors']}")


def cmd_answer(args) -> None:
  from rmmjax.eval.answering import agent_answerer, evaluate_answers, iris_answerer
  from rmmjax.io.outputs import check_output_file
  from rmmjax.io.workdir import atomic_write_json
  check_output_file(args.out, "--out")
  if args.limit is not None and args.limit < 1:
    raise ValueError(f"--limit {args.limit}: expected a positive number of questions")
  if not args.iris and not args.db:
    raise ValueError("rmmjax answer needs --db FILE (a bank built with ingest "
                     "--user-per-conversation), or --iris to answer from LaceMem")
  llm = _llm(args)
  if llm is None:
    raise ValueError("rmmjax answer needs an LLM: --llm-url URL --model NAME")
  encoder = _encoder()
  if args.iris:
    report = evaluate_answers(args.dataset, Path(args.data), iris_answerer(encoder, llm, args.m),
                              llm, limit=args.limit, progress=not args.quiet,
                              config={"memory": "lace", "iris": True, "m": args.m})
  else:
    with _bank(args.db, must_exist=True) as bank:
      agent = _agent(args, bank, encoder, learn=False, m=args.m, llm=llm)
      report = evaluate_answers(args.dataset, Path(args.data), agent_answerer(agent), llm,
                                limit=args.limit, progress=not args.quiet,
                                config={"memory": "bank", "retriever": args.retriever,
                                        "k": agent.settings.k, "m": args.m})
      report["agent"] = dict(agent.stats)
  atomic_write_json(Path(args.out), report)
  print(json.dumps(report["metrics"]["overall"], indent=2))
  print(f"wrote {args.out}")


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

  def retrieval_flags(p):
    p.add_argument("--retriever", default="hybrid", choices=RETRIEVERS)
    p.add_argument("--candidates", type=int, default=20, help="K memories retrieved")
    p.add_argument("--reranker", default=None, help="a training workdir or exported reranker")
    p.add_argument("--encoder", default=None, help="a tuned query encoder (workdir or export)")

  p = sub.add_parser("ingest", help="build a memory bank from a dataset's sessions")
  p.add_argument("--dataset", default="locomo", choices=("locomo", "msc"))
  p.add_argument("--data", required=True)
  p.add_argument("--db", required=True, help="the SQLite memory bank (created if missing)")
  p.add_argument("--user", default=None, help="the user all conversations belong to")
  p.add_argument("--user-per-conversation", action="store_true",
                 help="each conversation's id is its own user")
  p.add_argument("--quiet", action="store_true")
  llm_flags(p)
  p.set_defaults(func=cmd_ingest)

  p = sub.add_parser("recall", help="print the memories that would be handed to the LLM")
  p.add_argument("--db", required=True)
  p.add_argument("--user", required=True)
  p.add_argument("--k", type=int, default=5, help="memories handed to the LLM")
  p.add_argument("--json", action="store_true")
  retrieval_flags(p)
  p.add_argument("query")
  p.set_defaults(func=cmd_recall)

  p = sub.add_parser("chat", help="talk with the agent (stdin); /end reflects the session")
  p.add_argument("--db", required=True)
  p.add_argument("--user", required=True)
  p.add_argument("--m", type=int, default=5, help="memories shown per answer")
  p.add_argument("--batch", type=int, default=4, help="rewarded answers per reranker update")
  p.add_argument("--workdir", default=None, help="where the reranker is checkpointed")
  p.add_argument("--serve", action="store_true", help="never update the reranker")
  retrieval_flags(p)
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
