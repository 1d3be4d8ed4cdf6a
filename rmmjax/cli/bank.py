"""`rmmjax ingest` (a dataset into a bank) and `rmmjax memory list|export|import|delete` (a
bank's users as whole units; docs/command-line.md, **memory**)."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

from rmmjax.cli.common import add_llm_flags, bank, encoder_for, llm_from_flags
from rmmjax.data.locomo import load_locomo
from rmmjax.data.msc import load_msc
from rmmjax.encode.cache import EmbeddingCache, cache_path
from rmmjax.io.manifest import read_json
from rmmjax.io.outputs import check_output_file
from rmmjax.io.workdir import atomic_write_json
from rmmjax.memory.ingest import IngestStopped, ingest_conversations, plan_ingest
from rmmjax.memory.lace import synced_lace
from rmmjax.memory.reflection import LLMReflector
from rmmjax.memory.topics import OfflineReflector
from rmmjax.memory.texts import embedded_texts


def cmd_ingest(args) -> None:
  conversations, report = {"locomo": load_locomo, "msc": load_msc}[args.dataset](Path(args.data))
  plan_ingest(conversations, args.user, args.user_per_conversation)  # before the bank exists
  llm = llm_from_flags(args)
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


def _cmd_list(args) -> None:
  with bank(args.db, must_exist=True) as memory_bank:
    for user in memory_bank.users():
      sessions = memory_bank.sessions(user)
      print(f"{user}: {len(sessions)} sessions ({sum(not s.ended for s in sessions)} open), "
            f"{len(memory_bank.memories(user))} memories")


def _cmd_export(args) -> None:
  check_output_file(args.out, "--out")
  with bank(args.db, must_exist=True) as memory_bank:
    data = memory_bank.export_user(args.user)
    encrypted = memory_bank.cipher.encrypted
  atomic_write_json(Path(args.out), data)
  lace = data["lace"]
  print(f"wrote {args.out}: user {args.user!r}, {len(data['sessions'])} sessions, "
        f"{sum(len(s['turns']) for s in data['sessions'])} turns, {len(data['memories'])} "
        f"memories, " + (f"a LaceMem of {len(lace['facts'])} facts" if lace else "no LaceMem"))
  if encrypted:
    print(f"note: {args.out} is plain JSON: the bank's encryption does not carry over to it",
          file=sys.stderr)


def _cmd_import(args) -> None:
  path = Path(getattr(args, "in"))
  if not path.is_file():
    raise FileNotFoundError(f"--in {path} does not exist (write one with rmmjax memory export)")
  data = read_json(path, "expected what rmmjax memory export writes", where=f"--in {path}")
  db = Path(args.db)
  new = not db.exists()
  try:
    with bank(args.db, must_exist=False) as memory_bank:
      user = memory_bank.import_user(data, user=args.user)
      print(f"imported {path} as user {user!r} into {args.db}: "
            f"{len(memory_bank.sessions(user))} sessions, {len(memory_bank.memories(user))} "
            f"memories")
  except BaseException:
    if new:  # a bank this command created holds nothing when the import failed: no file stays
      for leftover in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
        leftover.unlink(missing_ok=True)
    raise


def _cmd_delete(args) -> None:
  with bank(args.db, must_exist=True) as memory_bank:
    texts = embedded_texts(memory_bank, args.user)
    # The cache first: a kill between the two leaves the user in the bank, so the same command
    # can run again; the other way round their vectors would stay in the cache for good.
    if not memory_bank.cipher.encrypted and Path(cache_path()).is_file():
      with contextlib.closing(EmbeddingCache(cache_path())) as cache:
        gone = cache.forget(texts)
      print(f"removed {gone} embeddings of their texts from the cache {cache_path()}")
    memory_bank.delete_user(args.user)
  print(f"deleted user {args.user!r} from {args.db}")


def add_parsers(sub) -> None:
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
  add_llm_flags(p, what="to reflect with; without one the offline reflector")
  p.set_defaults(func=cmd_ingest)

  p = sub.add_parser("memory", help="a bank's users: list, export, import, delete")
  commands = p.add_subparsers(dest="memory_command", required=True)
  q = {}
  for name, func, what in (
      ("list", _cmd_list, "the bank's users, with their sessions and memories"),
      ("export", _cmd_export, "everything the bank holds of a user, as JSON"),
      ("import", _cmd_import, "a user from an export, into a bank without them"),
      ("delete", _cmd_delete, "every row of a user, and their cached embeddings")):
    q[name] = commands.add_parser(name, help=what)
    q[name].add_argument("--db", required=True)
    q[name].set_defaults(func=func)
  q["export"].add_argument("--user", required=True)
  q["export"].add_argument("--out", required=True)
  q["import"].add_argument("--in", required=True, help="a file written by rmmjax memory export")
  q["import"].add_argument("--user", default=None,
                           help="import under this user id (default: the file's)")
  q["delete"].add_argument("--user", required=True)
