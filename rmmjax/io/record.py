"""What a trained model fits: the record written with every run and export, by which evaluation
refuses a model on data it does not fit and leaves out every conversation it trained on."""

from __future__ import annotations

import subprocess
from pathlib import Path

from rmmjax.encode.protocol import encoder_identity, file_sha256

# The settings a reranker's candidates were made with; evaluation must use the same.
FIT_KEYS = ("dataset", "units", "retriever", "encoder", "k", "dim", "query_encoder", "iris")


def code_commit() -> str:
  """The commit of the rmmjax checkout this process runs from, with " (with uncommitted
  changes)" where its tree differs; "unknown" outside a git checkout."""
  root = Path(__file__).resolve().parents[2]
  git = lambda *a: subprocess.run(["git", "-C", str(root), *a], capture_output=True,  # noqa
                                  text=True, timeout=30)
  try:
    head, changes = git("rev-parse", "HEAD"), git("status", "--porcelain", "--", "rmmjax")
  except (OSError, subprocess.SubprocessError):
    return "unknown"
  if head.returncode:
    return "unknown"
  return head.stdout.strip() + (" (with uncommitted changes)" if changes.stdout.strip() else "")


def conversation_entries(convs) -> list[dict]:
  return [{"id": c.conversation_id, "fingerprint": c.fingerprint} for c in convs]


def replay_record(cfg, data: Path, encoder, train_convs, heldout_convs) -> dict:
  """The record of a replay run (cfg a rmmjax.config.Config, data its resolved dataset file)."""
  return {"kind": "replay", "dataset": cfg.dataset, "data": str(data),
          "data_sha256": file_sha256(data), "units": cfg.units, "retriever": cfg.retriever,
          "encoder": encoder_identity(encoder), "k": cfg.k, "m": cfg.m, "dim": cfg.dim,
          "trained_conversations": conversation_entries(train_convs),
          "heldout_conversations": conversation_entries(heldout_convs)}


def with_ancestors(record: dict, ancestors: list[tuple[str, dict]]) -> dict:
  """The record of a model built from others (`ancestors`: (source, record) of a tuned query
  encoder that gives its candidates or starts its anchor): it lists them, and its
  trained_conversations gain theirs. Refuses one whose held-out conversations they trained on."""
  leaked = [(e["id"], source) for e in record.get("heldout_conversations", [])
            for source, anc in ancestors if trained_on(anc, e["id"], e["fingerprint"])]
  if leaked:
    names = ", ".join(dict.fromkeys(c for c, _ in leaked))
    raise ValueError(f"{leaked[0][1]} trained on {names}, which this run would hold out: its "
                     "held-out numbers would be in-sample; hold out other conversations "
                     "(holdout, or a data file in another order) or start from a model that "
                     "did not train on them")
  entries = list(record["trained_conversations"])
  seen = {(e["id"], e["fingerprint"]) for e in entries}
  for e in (e for _, anc in ancestors for e in anc.get("trained_conversations", [])):
    if (e["id"], e["fingerprint"]) not in seen:
      seen.add((e["id"], e["fingerprint"]))
      entries.append(e)
  return record | {"trained_conversations": entries, "ancestors": [
      {"source": source, "trained_conversations": anc.get("trained_conversations", [])}
      for source, anc in ancestors]}


def latent_record(cfg) -> dict:
  """The record of a latent-simulator run: it never saw a real conversation or encoder."""
  return {"kind": "latent", "dataset": None, "units": None, "retriever": None,
          "encoder": "latent simulator", "k": cfg.k, "m": cfg.m, "dim": cfg.dim,
          "trained_conversations": [], "heldout_conversations": []}


def trained_on(record: dict, conversation_id: str, fingerprint: str) -> bool:
  """Whether the record's reranker trained on this conversation (same id or same turns)."""
  return any(e["id"] == conversation_id or e["fingerprint"] == fingerprint
             for e in record.get("trained_conversations", []))


def mismatches(record: dict, wanted: dict, used: str = "evaluated") -> list[str]:
  """The FIT_KEYS on which a use's settings (an evaluation, the agent) differ from the record."""
  return [f"{key}: trained with {record.get(key)!r}, {used} with {wanted[key]!r}"
          for key in FIT_KEYS if key in wanted and record.get(key) != wanted[key]]


def check_fit(source: str, record: dict, wanted: dict, allow_mismatch: bool) -> list[str]:
  """The mismatches between a model's record and an evaluation's settings, refused unless
  allowed."""
  found = mismatches(record, wanted)
  if found and not allow_mismatch:
    raise ValueError(f"{source} does not fit this evaluation (" + "; ".join(found) + "): use it "
                     "with the settings it was trained with, or pass --allow-mismatch to record "
                     "the mismatch in the report")
  return found
