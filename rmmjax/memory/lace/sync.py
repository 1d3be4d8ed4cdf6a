"""A user's LaceMem kept in step with the user's turns in the bank, which are the record it is
derived from (docs/memory.md: IRIS's layered memory follows the bank)."""

from __future__ import annotations

from tqdm import tqdm

from rmmjax.memory.bank import MemoryBank
from rmmjax.memory.lace.settings import LaceSettings
from rmmjax.memory.lace.store import LaceMem
from rmmjax.memory.records import EncoderMismatch, UnknownRecord

# A progress bar from this many missing turns on; turns are embedded this many at a time.
PROGRESS_FROM = 20
CHUNK = 64
EVIDENCE = "statement"  # the kind of turn a LaceMem takes


def synced_lace(bank: MemoryBank, user: str, encoder, *, settings: LaceSettings | None = None,
                progress: bool = True, rebuild: bool = False) -> tuple[LaceMem, int]:
  """The user's LaceMem holding every turn of theirs in the bank, and how many turns this call
  added (0: it was up to date, and nothing was written). `settings` apply to a LaceMem built
  here; a saved one keeps its own. `rebuild` builds it afresh from the bank's turns (a saved
  one embedded by another encoder is refused without it); the bank refuses a user it lacks."""
  lace = LaceMem(encoder, settings=settings)  # unless a saved one loads
  if not rebuild:
    try:
      lace = LaceMem.load(bank, user, encoder)
    except UnknownRecord:
      pass
    except EncoderMismatch as err:
      raise EncoderMismatch(f"{err} (--rebuild-lace rebuilds it from the user's turns with "
                            f"this encoder)") from None
  added = add_missing_turns(lace, bank, user, progress=progress)
  if rebuild and not added:
    lace.save(bank, user)  # replaces the saved one even when the user has no turns
  return lace, added


def add_missing_turns(lace: LaceMem, bank: MemoryBank, user: str, *, progress: bool = False) -> int:
  """Adds the user's bank turns that `lace` lacks, in the bank's order, and saves it when any
  were; returns how many."""
  if not (missing := bank.turns_not_in(user, lace.turn_ids(), EVIDENCE)):
    return 0
  with tqdm(total=len(missing), desc=f"LaceMem of {user}", unit="turn",
            disable=not progress or len(missing) < PROGRESS_FROM) as bar:
    for lo in range(0, len(missing), CHUNK):
      chunk = missing[lo:lo + CHUNK]
      lace.add_turns([(t.turn_id, t.session_id, t.date, t.speaker, t.text) for t in chunk])
      bar.update(len(chunk))
  lace.save(bank, user)
  return len(missing)
