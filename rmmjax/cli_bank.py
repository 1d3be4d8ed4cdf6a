"""`rmmjax memory list|export|import|delete`: a bank's users as whole units.

An export holds everything the bank keeps of one user (sessions and turns, memories with their
snippets and embeddings, the saved LaceMem), as plain JSON: import fills a new user with exactly
that. Delete removes every row of the user and, for a plain bank, the embedding cache's vectors
of every text the bank held of them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _cmd_list(args) -> None:
  from rmmjax.cli_common import bank
  with bank(args.db, must_exist=True) as memory_bank:
    for user in memory_bank.users():
      sessions = memory_bank.sessions(user)
      print(f"{user}: {len(sessions)} sessions ({sum(not s.ended for s in sessions)} open), "
            f"{len(memory_bank.memories(user))} memories")


def _cmd_export(args) -> None:
  from rmmjax.cli_common import bank
  from rmmjax.io.outputs import check_output_file
  from rmmjax.io.workdir import atomic_write_json
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
  from rmmjax.cli_common import bank
  path = Path(getattr(args, "in"))
  if not path.is_file():
    raise FileNotFoundError(f"--in {path} does not exist (write one with rmmjax memory export)")
  try:
    data = json.loads(path.read_text())
  except (UnicodeDecodeError, ValueError) as err:
    raise ValueError(f"--in {path} is not JSON ({err}); expected what rmmjax memory export "
                     f"writes") from None
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
  from rmmjax.cli_common import bank
  from rmmjax.encode.cache import EmbeddingCache
  from rmmjax.encode.encoder import DEFAULT_CACHE
  from rmmjax.memory.texts import embedded_texts
  with bank(args.db, must_exist=True) as memory_bank:
    texts = embedded_texts(memory_bank, args.user)
    # The cache first: a kill between the two leaves the user in the bank, so the same command
    # can run again; the other way round their vectors would stay in the cache for good.
    if not memory_bank.cipher.encrypted and Path(DEFAULT_CACHE).is_file():
      cache = EmbeddingCache(DEFAULT_CACHE)
      try:
        gone = cache.forget(texts)
      finally:
        cache.close()
      print(f"removed {gone} embeddings of their texts from the cache {DEFAULT_CACHE}")
    memory_bank.delete_user(args.user)
  print(f"deleted user {args.user!r} from {args.db}")


def add_parser(sub) -> None:
  p = sub.add_parser("memory", help="a bank's users: list, export, import, delete")
  commands = p.add_subparsers(dest="memory_command", required=True)
  q = commands.add_parser("list", help="the bank's users, with their sessions and memories")
  q.add_argument("--db", required=True)
  q.set_defaults(func=_cmd_list)
  q = commands.add_parser("export", help="everything the bank holds of a user, as JSON")
  q.add_argument("--db", required=True)
  q.add_argument("--user", required=True)
  q.add_argument("--out", required=True)
  q.set_defaults(func=_cmd_export)
  q = commands.add_parser("import", help="a user from an export, into a bank without them")
  q.add_argument("--db", required=True)
  q.add_argument("--in", required=True, help="a file written by rmmjax memory export")
  q.add_argument("--user", default=None, help="import under this user id (default: the file's)")
  q.set_defaults(func=_cmd_import)
  q = commands.add_parser("delete", help="every row of a user, and their cached embeddings")
  q.add_argument("--db", required=True)
  q.add_argument("--user", required=True)
  q.set_defaults(func=_cmd_delete)
