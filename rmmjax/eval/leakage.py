"""What an evaluation through trained models may use: it leaves out every conversation a model
trained on, and refuses a model on data it does not fit, saying so in the report."""

from __future__ import annotations

from rmmjax.replay.candidates import conversation_fingerprint
from rmmjax.io.record import trained_on


def unseen(conversations: list, models: list[tuple[str, dict]],
           in_sample: bool) -> tuple[list, dict]:
  """The conversations none of the models (source, record) trained on, unless in_sample, and
  the report's account of what was left out."""
  seen = [c for c in conversations
          if any(trained_on(record, c.conversation_id, conversation_fingerprint(c))
                 for _, record in models)]
  kept = conversations if in_sample else [c for c in conversations if c not in seen]
  if not kept:
    raise ValueError(f"every conversation of this file ({len(conversations)}) was trained on by "
                     f"{' and '.join(s for s, _ in models)}; evaluate on other conversations, "
                     "or pass --in-sample for in-sample numbers")
  return kept, {"in_sample": in_sample,
                "trained_conversations_in_file": [c.conversation_id for c in seen],
                "excluded_conversations": [] if in_sample else [c.conversation_id for c in seen]}
