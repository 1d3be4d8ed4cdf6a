"""The memory bank's SQLite schema, as migrations by version.

MIGRATIONS[v - 1] takes a bank from schema version v - 1 to v; a later layer (atomic facts,
edges) adds its tables as the next version. Every table that holds a user's data has a user_id
column: delete_user removes a user by it, so a new table needs nothing more to be covered.
"""

from __future__ import annotations

import sqlite3

from rmmjax.memory.crypto import KEY_CHECK, KEY_ENV, BankKeyError, Cipher
from rmmjax.memory._lace_rows import seal_cosine
from rmmjax.memory.records import BankFileError

MIGRATIONS: tuple[tuple[str, ...], ...] = (
    # 1: users, sessions, raw turns, topic memories with their snippets, embeddings.
    (
        "CREATE TABLE bank_meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
        "CREATE TABLE users (user_id TEXT PRIMARY KEY)",
        """CREATE TABLE sessions (
             user_id TEXT NOT NULL REFERENCES users (user_id) ON DELETE CASCADE,
             session_id TEXT NOT NULL, date TEXT NOT NULL, ordinal INTEGER NOT NULL,
             ended INTEGER NOT NULL DEFAULT 0 CHECK (ended IN (0, 1)),
             PRIMARY KEY (user_id, session_id), UNIQUE (user_id, ordinal))""",
        # Turn ids are unique per user (as within a conversation), so a snippet names its turn.
        """CREATE TABLE turns (
             user_id TEXT NOT NULL, session_id TEXT NOT NULL, turn_id TEXT NOT NULL,
             speaker TEXT NOT NULL, text TEXT NOT NULL, date TEXT NOT NULL,
             ordinal INTEGER NOT NULL,
             PRIMARY KEY (user_id, turn_id), UNIQUE (user_id, session_id, ordinal),
             FOREIGN KEY (user_id, session_id) REFERENCES sessions (user_id, session_id)
               ON DELETE CASCADE)""",
        # AUTOINCREMENT: a deleted user's memory ids are never handed to another user.
        """CREATE TABLE memories (
             memory_id INTEGER PRIMARY KEY AUTOINCREMENT,
             user_id TEXT NOT NULL REFERENCES users (user_id) ON DELETE CASCADE,
             summary TEXT NOT NULL, created REAL NOT NULL, updated REAL NOT NULL,
             UNIQUE (memory_id, user_id))""",
        "CREATE INDEX memories_by_user ON memories (user_id)",
        # Both keys carry user_id: a snippet cannot join one user's memory to another's turn.
        """CREATE TABLE snippets (
             memory_id INTEGER NOT NULL, user_id TEXT NOT NULL, turn_id TEXT NOT NULL,
             session_id TEXT NOT NULL, date TEXT NOT NULL, text TEXT NOT NULL,
             ordinal INTEGER NOT NULL,
             PRIMARY KEY (memory_id, turn_id),
             FOREIGN KEY (memory_id, user_id) REFERENCES memories (memory_id, user_id)
               ON DELETE CASCADE,
             FOREIGN KEY (user_id, turn_id) REFERENCES turns (user_id, turn_id)
               ON DELETE CASCADE)""",
        "CREATE INDEX snippets_by_turn ON snippets (user_id, turn_id)",
        # kind says what owner_id names ('memory' now; facts and other rows later).
        """CREATE TABLE embeddings (
             kind TEXT NOT NULL, owner_id INTEGER NOT NULL,
             user_id TEXT NOT NULL REFERENCES users (user_id) ON DELETE CASCADE,
             encoder TEXT NOT NULL, dim INTEGER NOT NULL CHECK (dim > 0),
             vector BLOB NOT NULL,
             PRIMARY KEY (kind, owner_id, encoder))""",
        "CREATE INDEX embeddings_by_user ON embeddings (user_id, kind, encoder)",
        # owner_id has no foreign key (its table depends on kind): triggers keep it honest.
        """CREATE TRIGGER embeddings_of_own_memory BEFORE INSERT ON embeddings
             WHEN NEW.kind = 'memory' AND NOT EXISTS (SELECT 1 FROM memories
               WHERE memory_id = NEW.owner_id AND user_id = NEW.user_id)
             BEGIN SELECT RAISE(ABORT, 'embedding of a memory the user does not have'); END""",
        """CREATE TRIGGER embeddings_follow_memory AFTER DELETE ON memories
             BEGIN DELETE FROM embeddings WHERE kind = 'memory'
               AND owner_id = OLD.memory_id; END""",
    ),
    # 2: LaceMem's layers (rmmjax.memory._lace_rows): its own raw turns (a layered memory is
    # saved and replaced as a whole, apart from the sessions reflection ends), atomic facts
    # with their vectors, and each fact's ranked semantic neighbours.
    (
        """CREATE TABLE lace_meta (
             user_id TEXT PRIMARY KEY REFERENCES users (user_id) ON DELETE CASCADE,
             settings TEXT NOT NULL, encoder TEXT NOT NULL,
             dim INTEGER NOT NULL CHECK (dim >= 0), fallbacks INTEGER NOT NULL)""",
        """CREATE TABLE lace_turns (
             user_id TEXT NOT NULL REFERENCES lace_meta (user_id) ON DELETE CASCADE,
             turn_id TEXT NOT NULL, ordinal INTEGER NOT NULL, session_id TEXT NOT NULL,
             date TEXT NOT NULL, speaker TEXT NOT NULL, text TEXT NOT NULL,
             PRIMARY KEY (user_id, turn_id), UNIQUE (user_id, ordinal))""",
        """CREATE TABLE lace_facts (
             user_id TEXT NOT NULL, fact_id INTEGER NOT NULL, turn_id TEXT NOT NULL,
             subject TEXT NOT NULL, predicate TEXT NOT NULL, object TEXT NOT NULL,
             time TEXT NOT NULL, text TEXT NOT NULL, vector BLOB NOT NULL,
             PRIMARY KEY (user_id, fact_id),
             FOREIGN KEY (user_id, turn_id) REFERENCES lace_turns (user_id, turn_id)
               ON DELETE CASCADE)""",
        """CREATE TABLE lace_links (
             user_id TEXT NOT NULL, fact_id INTEGER NOT NULL, rank INTEGER NOT NULL,
             neighbour_id INTEGER NOT NULL, cosine REAL NOT NULL,
             PRIMARY KEY (user_id, fact_id, rank),
             FOREIGN KEY (user_id, fact_id) REFERENCES lace_facts (user_id, fact_id)
               ON DELETE CASCADE,
             FOREIGN KEY (user_id, neighbour_id) REFERENCES lace_facts (user_id, fact_id)
               ON DELETE CASCADE)""",
    ),
    # 3: who opened each session (a writer appends only to sessions of its own kind), and a
    # version per user that every write of their memories sets from one bank-wide counter: a
    # search index checks it in one row lookup, and it never repeats, not even for a user who
    # was deleted and imported again.
    (
        "ALTER TABLE sessions ADD COLUMN origin TEXT NOT NULL DEFAULT 'ingest'",
        # The agent named the sessions it opened session-<n> before origins were recorded.
        "UPDATE sessions SET origin = 'chat' WHERE session_id GLOB 'session-[0-9]*'",
        "ALTER TABLE users ADD COLUMN version INTEGER NOT NULL DEFAULT 0",
        "CREATE TABLE bank_writes (n INTEGER NOT NULL)",
        "INSERT INTO bank_writes VALUES (0)",
    ),
    # 4: what each turn is (a statement, a question put to the agent, the agent's answer), set
    # by the writer: only statements are evidence for IRIS; indexes on LaceMem's foreign keys
    # (a cascaded delete scanned the child tables); a revision per saved LaceMem, so a save
    # writes only what is new when nobody else saved in between. Chat turns written before
    # kinds were kept are set by _kinds_of_chat_turns (the speaker may be encrypted).
    (
        "ALTER TABLE turns ADD COLUMN kind TEXT NOT NULL DEFAULT 'statement' "
        "CHECK (kind IN ('statement', 'question', 'answer'))",
        "CREATE INDEX lace_facts_by_turn ON lace_facts (user_id, turn_id)",
        "CREATE INDEX lace_links_by_neighbour ON lace_links (user_id, neighbour_id)",
        "ALTER TABLE lace_meta ADD COLUMN revision INTEGER NOT NULL DEFAULT 0",
    ),
)

LATEST = len(MIGRATIONS)


def _kinds_of_chat_turns(db: sqlite3.Connection, cipher: Cipher) -> None:
  """Before version 4 the agent wrote every chat line as a question and its reply after it."""
  rows = db.execute("SELECT t.user_id, t.turn_id, t.speaker FROM turns t JOIN sessions s USING "
                    "(user_id, session_id) WHERE s.origin = 'chat'").fetchall()
  db.executemany("UPDATE turns SET kind = ? WHERE user_id = ? AND turn_id = ?", [
      ("answer" if cipher.open_text(speaker) == "assistant" else "question", user, turn)
      for user, turn, speaker in rows])


def _seal_lace_cosines(db: sqlite3.Connection, cipher: Cipher) -> None:
  """An encrypted bank stored its LaceMem's link cosines in the clear before version 4."""
  if not cipher.encrypted:
    return
  rows = db.execute("SELECT user_id, fact_id, rank, cosine FROM lace_links WHERE "
                    "typeof(cosine) = 'real'").fetchall()
  db.executemany("UPDATE lace_links SET cosine = ? WHERE user_id = ? AND fact_id = ? AND "
                 "rank = ?", [(seal_cosine(cipher, c), u, f, r) for u, f, r, c in rows])


def migrate(db: sqlite3.Connection, cipher: Cipher, where: str) -> None:
  """Creates the schema in a new file, brings an older one up to date, and checks the key;
  inside the caller's write transaction, so a refused key leaves an old file as it was."""
  tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
  if "schema_version" not in tables:
    if tables:
      raise BankFileError(f"{where} is an SQLite file but not a memory bank (it has tables "
                          f"{sorted(tables)[:5]}); pick another path")
    db.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    db.execute("INSERT INTO schema_version VALUES (0)")
  version = db.execute("SELECT version FROM schema_version").fetchone()[0]
  if version > LATEST:
    raise BankFileError(f"{where} has schema version {version}; this rmmjax reads versions up "
                        f"to {LATEST}: upgrade rmmjax")
  for to, statements in enumerate(MIGRATIONS[version:], version + 1):
    for statement in statements:
      db.execute(statement)
    if to == 4 and version > 0:
      _kinds_of_chat_turns(db, cipher)
      _seal_lace_cosines(db, cipher)
  db.execute("UPDATE schema_version SET version = ?", (LATEST,))
  if version == 0:
    check = cipher.seal_bytes(KEY_CHECK).decode("ascii", "replace")
    db.executemany("INSERT INTO bank_meta VALUES (?, ?)", [
        ("encryption", "fernet" if cipher.encrypted else "none"), ("key_check", check)])
  meta = dict(db.execute("SELECT name, value FROM bank_meta"))
  if meta["encryption"] == "fernet" and not cipher.encrypted:
    raise BankKeyError(f"{where} is encrypted: open it with its key (set {KEY_ENV})")
  if meta["encryption"] != "fernet" and cipher.encrypted:
    raise BankKeyError(f"{where} is not encrypted, so a key is refused (its rows would mix plain "
                       f"and encrypted): open it without a key, or export_user and import_user "
                       f"into a new encrypted bank")
  if cipher.encrypted:
    try:
      cipher.open_bytes(meta["key_check"].encode("ascii"))
    except BankKeyError:
      raise BankKeyError(f"the key does not open {where} (it was encrypted with another "
                         f"key)") from None
