"""EviMem's layered memory (LaceMem): atomic facts (Index), links between them (Edge) and the
verbatim turns (Raw), built turn by turn or at once, searched by IRIS; kept in the bank beside a
user's turns (`synced_lace`), the bank alone writing its rows."""

from __future__ import annotations

from rmmjax.memory.lace.settings import LaceSettings
from rmmjax.memory.lace.store import LaceMem
from rmmjax.memory.lace.sync import add_missing_turns, synced_lace
from rmmjax.memory.lace.synthetic import synthetic_lace

__all__ = ["LaceMem", "LaceSettings", "add_missing_turns", "synced_lace", "synthetic_lace"]
