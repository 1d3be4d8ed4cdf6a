"""LaceMem: clause facts, edge weights and caps, streaming equal to batch, search, persistence."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest
import synthetic_locomo
from hash_encoder import HashEncoder

from rmmjax.data.locomo import load_locomo
from rmmjax.data.schema import Conversation, Session, Turn
from rmmjax.memory import EncoderMismatch, MemoryBank, UnknownRecord, generate_key
from rmmjax.memory.lace import LaceMem, LaceSettings
from rmmjax.memory.lace.facts import parse_clause, split_clauses, turn_drafts
from rmmjax.memory.lace.links import SemanticGraph, snap
from rmmjax.memory.lace import synthetic_lace
from rmmjax.retrieve.evidence import Fact, RawTurn

DATE = "1:56 pm on 8 May, 2023"
TALK = [("S1", "9 May 2023", "Ana", "I signed up for a pottery class and it starts next week."),
        ("S1", "9 May 2023", "Ben", "Nice! My sister is a potter; she sells bowls at the market."),
        ("S1", "9 May 2023", "Ana", "I adopted a puppy named Biscuit because I wanted company."),
        ("S2", "20 June 2023", "Ben", "We drove to the coast last weekend to watch the whales."),
        ("S2", "20 June 2023", "Ana", "Biscuit chewed my new sandals; I was furious.")]


def _stream(turns, encoder=None, **settings) -> LaceMem:
  lace = LaceMem(encoder or HashEncoder(), settings=LaceSettings(**settings))
  for n, (session, date, speaker, text) in enumerate(turns):
    lace.add_turn(f"D{n}", session, date, speaker, text)
  return lace


def _stream_conversation(conv: Conversation, encoder, settings=None) -> LaceMem:
  lace = LaceMem(encoder, settings=settings)
  for session in conv.sessions:
    for turn in session.turns:
      text = f"{turn.text} [shares an image: {turn.caption}]" if turn.caption else turn.text
      lace.add_turn(turn.turn_id, session.session_id, session.date, turn.speaker, text)
  return lace


def test_clauses_split_on_sentences_semicolons_and_long_connectors():
  assert split_clauses("I went to a support group yesterday and it was so powerful.") == [
      "I went to a support group yesterday", "it was so powerful."]
  assert split_clauses("Mel and I went hiking.") == ["Mel and I went hiking."]  # "Mel": too short
  assert split_clauses("I love painting; it calms me a lot because the colours help me relax.") == [
      "I love painting", "it calms me a lot", "because the colours help me relax."]
  assert split_clauses("Hey! How are you?") == ["Hey!", "How are you?"]
  assert split_clauses(":)") == [":)"] and split_clauses("  ") == []
  assert split_clauses("I went to a support group yesterday and it was so powerful.",
                       min_words=6) == ["I went to a support group yesterday and it was so "
                                        "powerful."]


def test_clause_subject_predicate_object():
  melanie = parse_clause("Melanie went to the beach with her kids", "Caroline")
  assert (melanie.subject, melanie.predicate, melanie.object) == (
      "Melanie", "went", "to the beach with her kids")
  keen = parse_clause("I'm keen on counseling!", "Caroline")
  assert (keen.subject, keen.predicate, keen.object) == ("Caroline", "am", "keen on counseling")
  assert parse_clause("Wow, you're great", "Ben").subject == "Ben"
  assert parse_clause("Anything new?", "Ben").predicate == "says"
  drafts = turn_drafts("Ana", "Look at this! [shares an image: a photo of a lake]")
  assert [d.clause for d in drafts] == ["Look at this!", "shares an image: a photo of a lake"]
  assert (drafts[1].predicate, drafts[1].object) == ("shares", "an image: a photo of a lake")


def test_facts_keep_speaker_date_and_image_captions():
  conv = Conversation("c", (Session("S1", DATE, (
      Turn("D1:1", "Ana", "Hi Ben! I baked bread today and it came out great."),
      Turn("D1:2", "Ben", "Look at my garden.", caption="a photo of red tulips"))),), ())
  lace = LaceMem.from_conversation(conv, HashEncoder())
  assert [f.text for f in lace.facts] == [
      f"[{DATE}] Ana: Hi Ben!", f"[{DATE}] Ana: I baked bread today",
      f"[{DATE}] Ana: it came out great.", f"[{DATE}] Ben: Look at my garden.",
      f"[{DATE}] Ben: shares an image: a photo of red tulips"]
  assert lace.fact(4) == Fact(4, "Ben", "shares", "an image: a photo of red tulips", DATE,
                              "D1:2", "S1", f"[{DATE}] Ben: shares an image: a photo of red tulips")
  assert lace.raw(lace.fact(4).turn_id) == RawTurn(
      "D1:2", "S1", DATE, "Ben", "Look at my garden. [shares an image: a photo of red tulips]")
  assert lace.facts_about("ana") == [0, 1, 2] and lace.facts_about("tulips") == [4]


def _facts(n: int, per_session: int = 1) -> tuple[list[RawTurn], list[Fact]]:
  turns = [RawTurn(f"T{i}", f"S{i // per_session}", "", "A", f"t{i}") for i in range(n)]
  return turns, [Fact(i, "A", "says", f"t{i}", "", f"T{i}", t.session_id, f"t{i}")
                 for i, t in enumerate(turns)]


def test_semantic_edges_hand_computed():
  # cos(a, b) = 0.8, cos(b, c) = 0.96, cos(a, c) = 0.6: each node keeps its single best.
  vectors = np.array([[1, 0, 0, 0], [0.8, 0.6, 0, 0], [0.6, 0.8, 0, 0]], np.float32)
  turns, facts = _facts(3)
  mutual = LaceMem.from_facts(turns, facts, vectors,
                              settings=LaceSettings(max_semantic=1, session_window=0))
  assert mutual.edges().keys() == {(1, 2)}
  assert mutual.edges()[(1, 2)] == pytest.approx(0.96, abs=2e-3)
  either = LaceMem.from_facts(turns, facts, vectors, settings=LaceSettings(
      max_semantic=1, session_window=0, semantic_rule="either"))
  assert either.edges().keys() == {(0, 1), (1, 2)}
  assert either.neighbours(1, 0.0) == [(2, either.edges()[(1, 2)]), (0, either.edges()[(0, 1)])]
  assert LaceMem.from_facts(turns, facts, vectors, settings=LaceSettings(
      max_semantic=1, session_window=0, min_cosine=0.97)).edges() == {}


def test_structural_edges_weights_window_and_larger_weight_wins():
  turns = [RawTurn("T0", "S", "", "A", "x"), RawTurn("T1", "S", "", "B", "y"),
           RawTurn("T2", "S", "", "A", "z")]
  facts = [Fact(i, "A", "says", "x", "", t, "S", "x")
           for i, t in enumerate(["T0", "T0", "T1", "T2", "T2"])]
  vectors = np.eye(5, dtype=np.float32)
  vectors[4] = vectors[2] = (vectors[2] + vectors[4]) / np.sqrt(2)  # facts 2 and 4: cosine 1
  lace = LaceMem.from_facts(turns, facts, vectors, settings=LaceSettings(
      same_turn=0.9, same_session=0.4, session_window=2))
  assert lace.edges() == {(0, 1): 0.9, (0, 2): 0.4, (1, 2): 0.4, (1, 3): 0.4, (2, 3): 0.4,
                          (2, 4): pytest.approx(1.0, abs=1e-3), (3, 4): 0.9}
  assert lace.neighbours(2, 0.5) == [(4, lace.edges()[(2, 4)])]


def _brute_force_edges(vectors: np.ndarray, k: int, threshold: float, rule: str) -> dict:
  v = snap(vectors).astype(np.float64)
  sims = v @ v.T
  np.fill_diagonal(sims, -np.inf)
  tops = [[j for j in sorted(range(len(v)), key=lambda j: (-sims[i, j], j))[:k]
           if sims[i, j] >= np.float32(threshold)] for i in range(len(v))]
  edges = {}
  for i, top in enumerate(tops):
    for j in top:
      if rule == "either" or i in tops[j]:
        edges[min(i, j), max(i, j)] = sims[i, j]
  return edges


@pytest.mark.parametrize("rule", ["mutual", "either"])
def test_streaming_and_blocked_batch_match_brute_force_with_ties(rule):
  rng = np.random.default_rng(0)
  base = rng.standard_normal((12, 8)).astype(np.float32)
  vectors = base[rng.integers(0, 12, 150)] + 0.3 * rng.standard_normal((150, 8))
  vectors[::7] = vectors[3]  # exact duplicates: ties that only the fact ids can break
  vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
  settings = dict(min_cosine=0.7, max_neighbours=3, chunk=16)
  batch = SemanticGraph.build(vectors, **settings)
  stream = SemanticGraph(8, **settings)
  for start in range(0, 150, 5):
    stream.add(vectors[start:start + 5])
  expected = _brute_force_edges(vectors, 3, 0.7, rule)
  assert len(expected) > 100
  for graph in (batch, stream):
    got = {(min(i, j), max(i, j)): c for i in range(150)
           for j, c in graph.linked(i, rule).items()}
    assert got == pytest.approx(expected, abs=0)
    if rule == "mutual":
      assert max(len(graph.linked(i, rule)) for i in range(150)) <= 3


def test_streaming_a_conversation_equals_the_batch_build(tmp_path):
  conv = load_locomo(synthetic_locomo.write(tmp_path / "c.json", 1, sessions=24, turns=24))[0][0]
  # A small chunk makes the batch build cross many blocks.
  for settings in (LaceSettings(), LaceSettings(chunk=256, max_semantic=3, semantic_rule="either",
                                                session_window=3)):
    batch = LaceMem.from_conversation(conv, HashEncoder(), settings=settings)
    stream = _stream_conversation(conv, HashEncoder(), settings)
    assert len(batch) > 2 * 256 and batch.facts == stream.facts and batch.turns == stream.turns
    edges, streamed = batch.edges(), stream.edges()
    assert edges.keys() == streamed.keys()
    assert max(abs(edges[e] - streamed[e]) for e in edges) <= 1e-6
    semantic = [w for w in edges.values() if w not in (1.0, 0.7)]
    assert len(semantic) > 0.2 * len(batch)  # the semantic layer is really exercised


def test_adding_turns_in_chunks_equals_the_batch_build(three):
  conv = load_locomo(three)[0][0]
  turns = [(t.turn_id, s.session_id, s.date, t.speaker,
            f"{t.text} [shares an image: {t.caption}]" if t.caption else t.text)
           for s in conv.sessions for t in s.turns]
  batch = LaceMem.from_conversation(conv, HashEncoder())
  chunked = LaceMem(HashEncoder())
  for lo in range(0, len(turns), 37):  # chunks that cut sessions anywhere
    chunked.add_turns(turns[lo:lo + 37])
  assert chunked.facts == batch.facts and chunked.turns == batch.turns
  edges, got = batch.edges(), chunked.edges()
  assert edges.keys() == got.keys() and max(abs(edges[e] - got[e]) for e in edges) <= 1e-6


def test_a_failed_chunk_of_turns_adds_none_of_them():
  lace = _stream(TALK[:2])
  n, edges = len(lace), lace.edges()
  for chunk, message in [
      ([("D5", "S3", "1 July", "Ana", "one"), ("D5", "S3", "1 July", "Ben", "two")],
       "turn 'D5' repeats a turn id"),
      ([("D5", "S3", "1 July", "Ana", "one"), ("D6", "S3", "2 July", "Ben", "two")],
       "gives session 'S3' another date"),
      ([("D5", "S3", "1 July", "Ana", "one"), ("D0", "S1", "9 May 2023", "Ben", "two")],
       "turn 'D0' is already")]:
    with pytest.raises(ValueError, match=message):
      lace.add_turns(chunk)
    assert len(lace) == n and lace.edges() == edges and len(lace.turns) == 2


def test_neighbours_respect_min_weight():
  lace = _stream(TALK)
  for i in range(len(lace)):
    everything = lace.neighbours(i, -1.0)
    assert [w for _, w in everything] == sorted((w for _, w in everything), reverse=True)
    for floor in (0.5, 0.7, 0.75, 1.0):
      assert lace.neighbours(i, floor) == [(j, w) for j, w in everything if w >= floor]
  assert any(lace.neighbours(i, 0.75) != lace.neighbours(i, 0.5) for i in range(len(lace)))
  with pytest.raises(UnknownRecord, match="no fact 99"):
    lace.neighbours(99, 0.5)


@pytest.mark.parametrize("retrieval", ["bm25", "dense", "hybrid"])
def test_search_finds_a_fact_by_its_words(retrieval):
  lace = _stream(TALK, retrieval=retrieval)
  best, score = lace.search("pottery class", 3)[0]
  assert "pottery class" in lace.fact(best).text and score > 0
  best = lace.search("drove to the coast to watch whales", 2)[0][0]
  assert lace.raw(lace.fact(best).turn_id).speaker == "Ben"
  assert len(lace.search("the", 50)) == len(lace)  # k beyond the facts, a stopword query


def test_search_sees_facts_added_while_querying():
  lace = _stream(TALK)
  before = lace.search("volcano Iceland", 3)
  assert all("volcano" not in lace.fact(i).text for i, _ in before)
  new = lace.add_turn("D9", "S3", "2 July 2023", "Ben", "I climbed a volcano in Iceland.")
  assert lace.search("volcano Iceland", 1)[0][0] == new[0]
  assert lace.facts_about("ben")[-1] == new[0]


def test_failed_add_turn_leaves_nothing_behind():
  lace = _stream(TALK[:2])
  n, edges = len(lace), lace.edges()
  with pytest.raises(ValueError, match="turn 'D0' is already"):
    lace.add_turn("D0", "S9", "x", "Ana", "hello there")
  with pytest.raises(ValueError, match="session 'S1' has date '9 May 2023'"):
    lace.add_turn("D7", "S1", "10 May 2023", "Ana", "hello there")
  lace.encoder = type("Narrow", (), {"identity": "x", "encode": lambda self, texts: np.eye(
      len(texts), 16, dtype=np.float32)})()
  with pytest.raises(ValueError, match="dimension 32 .the graph's., got 16"):
    lace.add_turn("D7", "S1", "9 May 2023", "Ana", "hello there")
  with pytest.raises(ValueError, match="min_cosine must be a cosine"):
    LaceSettings(min_cosine=1.5)
  with pytest.raises(ValueError, match="semantic_rule 'both' is not one of"):
    LaceSettings(semantic_rule="both")
  assert len(lace) == n and lace.edges() == edges and len(lace.turns) == 2
  lace.encoder = HashEncoder()
  assert lace.add_turn("D7", "S4", "10 May 2023", "Ana", "hello there") == [n]


@pytest.mark.parametrize("key", [None, generate_key()], ids=["plain", "encrypted"])
def test_save_and_load_round_trip(tmp_path, key):
  bank = MemoryBank(tmp_path / "bank.sqlite", key=key)
  bank.add_user("ana")
  lace = _stream(TALK)
  lace.save(bank, "ana")
  loaded = LaceMem.load(bank, "ana", HashEncoder())
  assert loaded.facts == lace.facts and loaded.turns == lace.turns
  assert loaded.edges() == lace.edges() and loaded.settings == lace.settings
  assert loaded.search("puppy Biscuit", 4) == lace.search("puppy Biscuit", 4)
  # Both keep growing alike: the semantic neighbour lists came back, not only the edges.
  for store in (lace, loaded):
    store.add_turn("D9", "S3", "1 July", "Ben", "Biscuit the puppy chewed the pottery bowls.")
  assert loaded.edges() == lace.edges()
  on_disk = b"".join(p.read_bytes() for p in tmp_path.glob("bank.sqlite*"))
  assert (b"Biscuit" in on_disk) == (key is None)
  bank.add_user("ben")
  with pytest.raises(UnknownRecord, match="'ben' has no saved LaceMem"):
    LaceMem.load(bank, "ben", HashEncoder())
  other = HashEncoder()
  other.identity = "another encoder"
  with pytest.raises(EncoderMismatch, match="embedded with encoder 'hashed bag"):
    LaceMem.load(bank, "ana", other)
  bank.close()


def test_deleting_a_user_removes_their_lace_rows(tmp_path):
  bank = MemoryBank(tmp_path / "bank.sqlite")
  for user in ("ana", "ben"):
    bank.add_user(user)
    _stream(TALK).save(bank, user)
  bank.delete_user("ana")
  tables = ("lace_meta", "lace_turns", "lace_facts", "lace_links")
  with sqlite3.connect(tmp_path / "bank.sqlite") as db:
    counts = {t: dict(db.execute(f"SELECT user_id, COUNT(*) FROM {t} GROUP BY user_id"))
              for t in tables}
  assert all("ana" not in c and c["ben"] > 0 for c in counts.values()), counts
  assert LaceMem.load(bank, "ben", HashEncoder()).edges() == _stream(TALK).edges()
  bank.close()


def test_edges_grow_linearly_with_the_facts():
  small, large = synthetic_lace(2000, 32), synthetic_lace(4000, 32)
  ratio = len(large.edges()) / len(small.edges())
  assert 1.8 < ratio < 2.2, ratio
  settings = large.settings
  assert all(len([w for _, w in large.neighbours(i, -1.0)])
             <= 2 * settings.session_window + settings.max_semantic for i in range(4000))


class CountingEncoder(HashEncoder):
  def __init__(self):
    self.calls = 0

  def encode(self, texts):
    self.calls += len(texts)
    return super().encode(texts)


def test_query_vector_is_the_search_embedding_and_remembers_the_last_query():
  lace = _stream(TALK)
  counting = lace.query_encoder = CountingEncoder()
  vector = lace.query_vector("pottery class")
  np.testing.assert_array_equal(vector, HashEncoder().encode(["pottery class"])[0])
  lace.search("pottery class", 3)
  lace.query_vector("pottery class")
  assert counting.calls == 1  # one embedding for the search and both asks
  with pytest.raises(ValueError, match="read-only"):
    vector[0] = 1.0
  for query in ("whales", "pottery class", "a", "b", "c"):
    lace.query_vector(query)
  assert counting.calls == 5  # the last 4 asked are remembered, "pottery class" among them
  lace.query_vector("whales")
  assert counting.calls == 6  # asked 4 queries ago: forgotten
  other = lace.query_encoder = CountingEncoder()
  lace.query_vector("pottery class")
  assert other.calls == 1  # another encoder embeds afresh
  # The facts' rows are their texts' embeddings, as stored (snapped to a grid of 2^-11).
  facts = [lace.facts[i] for i in (4, 0, 2)]
  np.testing.assert_allclose(lace.fact_vectors([f.fact_id for f in facts]),
                             HashEncoder().encode([f.text for f in facts]), atol=2.0**-11)
  with pytest.raises(UnknownRecord):
    lace.fact_vectors([len(lace)])


def _lace_rows(path, user="ana") -> dict:
  with sqlite3.connect(path) as db:
    return {"subjects": [r[0] for r in db.execute(
                "SELECT subject FROM lace_facts WHERE user_id = ? ORDER BY fact_id", (user,))],
            "links": db.execute("SELECT fact_id, rank, neighbour_id, typeof(cosine) FROM "
                                "lace_links WHERE user_id = ? ORDER BY fact_id, rank",
                                (user,)).fetchall()}


def test_a_save_writes_only_what_is_new_unless_another_saved_in_between(tmp_path):
  path = tmp_path / "bank.sqlite"
  bank = MemoryBank(path)
  bank.add_user("ana")
  lace = _stream(TALK[:3])
  lace.save(bank, "ana")
  # A marker on an old row: a save that rewrites everything would put the true subject back.
  with sqlite3.connect(path) as db:
    db.execute("UPDATE lace_facts SET subject = 'marker' WHERE user_id = 'ana' AND fact_id = 0")
  new = lace.add_turns([(f"D{n}", *turn) for n, turn in enumerate(TALK[3:], 3)])
  lace.save(bank, "ana")
  assert _lace_rows(path)["subjects"][0] == "marker" and new
  loaded = LaceMem.load(bank, "ana", HashEncoder())
  assert loaded.facts[1:] == lace.facts[1:] and loaded.edges() == lace.edges()
  # The semantic lists an insert changed were rewritten: a reload keeps growing alike.
  for store in (lace, loaded):
    store.add_turn("D8", "S3", "1 July", "Ben", "Biscuit the puppy chewed the pottery bowls.")
  assert loaded.edges() == lace.edges()
  # Another process saved in between: this one's save replaces the whole (marker gone).
  loaded.save(bank, "ana")
  with sqlite3.connect(path) as db:
    db.execute("UPDATE lace_facts SET subject = 'marker' WHERE user_id = 'ana' AND fact_id = 0")
  lace.add_turn("D9", "S3", "1 July", "Ana", "The whales came back in July.")
  lace.save(bank, "ana")
  assert _lace_rows(path)["subjects"][0] == lace.facts[0].subject
  again = LaceMem.load(bank, "ana", HashEncoder())
  assert again.facts == lace.facts and again.edges() == lace.edges()
  bank.close()


def test_an_encrypted_bank_seals_the_links_cosines_and_the_foreign_keys_are_indexed(tmp_path):
  path = tmp_path / "bank.sqlite"
  with MemoryBank(path, key=generate_key()) as bank:
    bank.add_user("ana")
    lace = _stream(TALK)
    lace.save(bank, "ana")
    lace.add_turn("D9", "S3", "1 July", "Ben", "Biscuit the puppy chewed the pottery bowls.")
    lace.save(bank, "ana")  # the appended rows too
    assert LaceMem.load(bank, "ana", HashEncoder()).edges() == lace.edges()
  links = _lace_rows(path)["links"]
  assert links and {kind for *_, kind in links} == {"blob"}
  with sqlite3.connect(path) as db:
    indexed = {(table, row[2]) for table in ("lace_facts", "lace_links")
               for idx in db.execute(f"PRAGMA index_list({table})")
               for row in db.execute(f"PRAGMA index_info({idx[1]})")}
  assert ("lace_facts", "turn_id") in indexed and ("lace_links", "neighbour_id") in indexed
