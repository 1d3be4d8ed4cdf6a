"""Small LoCoMo-format conversations the suite builds itself, so that every test of the LoCoMo
pipeline runs on a fresh clone (the real dev file, where it is beside the project, is the extra
the data tests read).

Each conversation is two people talking over dated sessions: what each of them did (an activity,
an object, a place, a companion), small talk, now and then a shared photo, and questions in the
five LoCoMo categories whose evidence is the turns that say it. The words are drawn per
conversation, so conversations differ and a retriever has to match the question's words (who,
what, where, when) to find the evidence, as on the real file.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

NAMES = ["Caroline", "Melanie", "Jon", "Gina", "Nate", "Joanna", "Tim", "John", "Maria", "Audrey",
         "Andrew", "Deborah", "Evan", "Sam", "Calvin", "Dave"]
# (past tense, base form, object)
ACTIVITIES = [("painted", "paint", "a sunrise over the lake"), ("baked", "bake", "a lemon cake"),
              ("repaired", "repair", "an old motorcycle"), ("adopted", "adopt", "a grey kitten"),
              ("planted", "plant", "tomatoes in the garden"), ("wrote", "write", "a poem"),
              ("bought", "buy", "a second-hand guitar"), ("built", "build", "a bookshelf"),
              ("ran", "run", "a charity marathon"), ("visited", "visit", "the science museum"),
              ("joined", "join", "a pottery class"), ("read", "read", "a novel about dragons"),
              ("cooked", "cook", "a spicy curry"), ("photographed", "photograph", "the stars"),
              ("sewed", "sew", "a quilt for the baby"), ("climbed", "climb", "the lighthouse")]
PLACES = ["Lisbon", "Oslo", "the harbour", "the community centre", "the beach", "Boston",
          "the library", "the farmers market", "the mountains", "the city park", "Berlin",
          "the art gallery"]
WITH = ["my sister", "my kids", "an old friend", "my neighbour", "the support group", "my dad"]
SMALL_TALK = ["That sounds wonderful, tell me more!", "Wow, I did not expect that.",
              "Haha, that is so you.", "I am glad you are doing well.",
              "How have you been lately?", "Thanks for sharing that with me."]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December"]


def _date(rng, year: int, month: int) -> tuple[str, str]:
  day, hour, minute = int(rng.integers(1, 28)), int(rng.integers(1, 12)), int(rng.integers(0, 60))
  when = f"{hour}:{minute:02d} {'am' if rng.random() < 0.5 else 'pm'} on {day} {MONTHS[month]}, {year}"
  return when, f"{day} {MONTHS[month]} {year}"


def conversation(index: int, sessions: int = 5, turns: int = 14) -> dict:
  """One conversation in LoCoMo's released schema, with its questions."""
  rng = np.random.default_rng(1000 + index)
  a, b = (str(x) for x in rng.choice(NAMES, 2, replace=False))
  chat: dict = {"speaker_a": a, "speaker_b": b}
  events = []  # (speaker, verb, object, place, companion, dia_id, date)
  for s in range(1, sessions + 1):
    when, date = _date(rng, 2023, (index + 2 * s) % 12)
    chat[f"session_{s}_date_time"] = when
    rows = []
    for t in range(1, turns + 1):
      speaker = a if t % 2 else b
      dia = f"D{s}:{t}"
      if rng.random() < 0.75:
        past, verb, obj = ACTIVITIES[int(rng.integers(len(ACTIVITIES)))]
        place, friend = str(rng.choice(PLACES)), str(rng.choice(WITH))
        text = f"Last weekend I {past} {obj} in {place} with {friend}."
        events.append((speaker, verb, obj, place, friend, dia, date))
      else:
        text = str(rng.choice(SMALL_TALK))
      row = {"speaker": speaker, "dia_id": dia, "text": text}
      if rng.random() < 0.1:
        row["img_url"] = ["https://example.invalid/photo.jpg"]
        row["blip_caption"] = f"a photo of {rng.choice(PLACES)}"
      rows.append(row)
    chat[f"session_{s}"] = rows
  qa = []
  for speaker, verb, obj, place, friend, dia, date in events:
    kind = rng.random()
    if kind < 0.35:  # single-hop
      qa.append({"question": f"What did {speaker} {verb} in {place}?", "answer": obj,
                 "evidence": [dia], "category": 4})
    elif kind < 0.6:  # temporal
      qa.append({"question": f"When did {speaker} {verb} {obj}?", "answer": date,
                 "evidence": [dia], "category": 2})
    elif kind < 0.75:  # open-domain
      qa.append({"question": f"Who went with {speaker} to {place}?", "answer": friend,
                 "evidence": [dia], "category": 3})
    else:  # adversarial: asked about the other speaker
      other = b if speaker == a else a
      qa.append({"question": f"What did {other} {verb} in {place}?", "evidence": [dia],
                 "category": 5, "adversarial_answer": obj})
  by_speaker: dict[str, list] = {}
  for event in events:
    by_speaker.setdefault(event[0], []).append(event)
  for speaker, evs in by_speaker.items():  # multi-hop: two of one speaker's events, far apart
    half = len(evs) // 2
    for first, second in list(zip(evs[:half], evs[half:]))[:3]:
      qa.append({"question": f"Which places did {speaker} go to, for {first[2]} and for "
                             f"{second[2]}?", "answer": f"{first[3]} and {second[3]}",
                 "evidence": [first[5], second[5]], "category": 1})
  return {"sample_id": f"syn-{index + 1}", "conversation": chat, "qa": qa}


def write(path: Path, conversations: int = 3, **sizes) -> Path:
  """A LoCoMo-format file of `conversations` synthetic conversations (ids syn-1, syn-2, ...)."""
  path.write_text(json.dumps([conversation(i, **sizes) for i in range(conversations)]))
  return path
