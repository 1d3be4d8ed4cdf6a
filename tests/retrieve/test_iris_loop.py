"""IRIS: budgets, edge expansion, entity buffers, refinement schedules, judges and stopping."""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from typing import final

import pytest

from rmmjax.llm.base import LLMError
from scripted_llm import ScriptedLLM
from rmmjax.retrieve.evidence import Fact, RawTurn
from rmmjax.retrieve.iris import IrisSettings, expand, iris_retrieve, merge_by_rank
from rmmjax.retrieve.judges import (HeuristicJudge, LLMJudge, OracleJudge, SufficiencyJudge,
                                    Verdict, verdict_reward)
from rmmjax.retrieve.refine import (QueryRefiner, RefineRequest, RuleRefiner,
                                    is_temporal, named_entities)

TURNS = {
    "D1:1": ("S1", "8 May 2023", "Caroline", "I went to an LGBTQ support group yesterday."),
    "D1:2": ("S1", "8 May 2023", "Melanie", "I painted a sunrise over the lake last year."),
    "D1:3": ("S1", "8 May 2023", "Caroline", "I am researching adoption agencies."),
    "D2:1": ("S2", "25 May 2023", "Melanie", "I ran a charity race for mental health."),
    "D2:2": ("S2", "25 May 2023", "Caroline", "My grandmother gave me a necklace from Sweden."),
    "D2:3": ("S2", "25 May 2023", "Melanie", "We went camping at the beach with the kids."),
    "D3:1": ("S3", "9 June 2023", "Caroline", "The adoption interview is in August."),
    "D3:2": ("S3", "9 June 2023", "Melanie", "Pottery class calms me down."),
}
FACTS = [  # (subject, predicate, object, turn)
    ("Caroline", "attended", "LGBTQ support group", "D1:1"),
    ("Caroline", "found", "support group powerful", "D1:1"),
    ("Melanie", "painted", "sunrise over the lake", "D1:2"),
    ("Caroline", "researches", "adoption agencies", "D1:3"),
    ("Melanie", "ran", "charity race for mental health", "D2:1"),
    ("Caroline", "received", "necklace from grandmother", "D2:2"),
    ("necklace", "comes from", "Sweden", "D2:2"),
    ("Melanie", "went camping", "beach with kids", "D2:3"),
    ("Caroline", "has", "adoption interview in August", "D3:1"),
    ("Melanie", "takes", "pottery class", "D3:2"),
]
EDGES = {0: [(1, 1.0), (3, 0.7)], 1: [(0, 1.0)], 2: [(9, 0.6)], 3: [(8, 0.8), (0, 0.7)],
         4: [(9, 0.4), (7, 0.7)], 5: [(6, 1.0)], 6: [(5, 1.0)], 7: [(4, 0.7)], 8: [(3, 0.8)],
         9: [(4, 0.4), (2, 0.6)]}
_STOP = {"a", "an", "the", "did", "does", "do", "what", "when", "where", "which", "who", "to",
         "of", "in", "for", "with", "from", "and", "is", "at", "over"}


def _tokens(text: str) -> set[str]:
  return {w for w in re.findall(r"[a-z]+", text.lower()) if w not in _STOP}


@final
class FakeStore:
  """A deterministic EvidenceStore: search counts query words in a fact's predicate and object."""

  def __init__(self):
    self.facts = {}
    for i, (subject, predicate, obj, turn) in enumerate(FACTS):
      session, date, speaker, _ = TURNS[turn]
      self.facts[i] = Fact(i, subject, predicate, obj, date, turn, session,
                           f"[{date}] {subject}: {predicate} {obj}")
    self.searches: list[tuple[str, int]] = []

  def search(self, query: str, k: int) -> list[tuple[int, float]]:
    self.searches.append((query, k))
    q = _tokens(query)
    scored = [(i, float(len(q & _tokens(f"{f.predicate} {f.object}"))))
              for i, f in self.facts.items()]
    return sorted((s for s in scored if s[1] > 0), key=lambda s: (-s[1], s[0]))[:k]

  def fact(self, fact_id: int) -> Fact:
    return self.facts[fact_id]

  def neighbours(self, fact_id: int, min_weight: float) -> list[tuple[int, float]]:
    return [(f, w) for f, w in EDGES.get(fact_id, []) if w >= min_weight]

  def raw(self, turn_id: str) -> RawTurn:
    session, date, speaker, text = TURNS[turn_id]
    return RawTurn(turn_id, session, date, speaker, text)

  def facts_about(self, entity: str) -> list[int]:
    e = entity.lower()
    return [i for i, f in self.facts.items() if e in f.subject.lower() or e in f.object.lower()]


@final
class FixedJudge(SufficiencyJudge):
  """Returns the given verdicts in order (the last repeats) and records what it was shown."""

  def __init__(self, *verdicts: Verdict, sleep_s: float = 0.0):
    self.verdicts, self.sleep_s = list(verdicts), sleep_s
    self.shown: list[list[int]] = []

  def judge(self, question: str, facts: Sequence[Fact], raws: Mapping[str, RawTurn], *,
            category: str | None = None) -> Verdict:
    time.sleep(self.sleep_s)
    self.shown.append([f.fact_id for f in facts])
    return self.verdicts[min(len(self.shown), len(self.verdicts)) - 1]


ONE = IrisSettings(max_iterations=1)
PARTIAL = Verdict("PARTIAL", 0.1, "")


def test_budget_grows_by_step_per_iteration():
  assert [IrisSettings().budget(i) for i in (1, 2, 3)] == [10, 13, 16]
  assert IrisSettings(base_budget=4, budget_step=0, max_iterations=5).budget(5) == 4
  store = FakeStore()
  result = iris_retrieve(store, "support group", judge=FixedJudge(PARTIAL))
  assert [t.budget for t in result.trace] == [10, 13, 16]
  # The anchor is searched once at the deepest budget; each iteration takes its prefix, which
  # is what a search at that iteration's budget returns.
  assert [k for q, k in store.searches if q == "support group"] == [16]
  for t in result.trace:
    assert list(t.anchor_hits) == [f for f, _ in FakeStore().search("support group", t.budget)]
  assert [k for q, k in store.searches if q != "support group"] == [13, 16]


def test_one_hop_expansion_respects_weight_threshold_and_switch():
  settings = IrisSettings(max_iterations=1, use_entity_buffers=False)
  result = iris_retrieve(FakeStore(), "charity race", judge=FixedJudge(PARTIAL),
                         settings=settings)
  assert result.fact_ids == (4, 7)  # 4 -> 7 at 0.7 kept; 4 -> 9 at 0.4 dropped
  assert result.trace[0].expanded == (7,)
  off = iris_retrieve(FakeStore(), "charity race", judge=FixedJudge(PARTIAL),
                      settings=IrisSettings(max_iterations=1, use_entity_buffers=False,
                                            use_edges=False))
  assert off.fact_ids == (4,)
  low = IrisSettings(max_iterations=1, edge_min_weight=0.3)
  assert expand(FakeStore(), [4], low) == [7, 9]
  assert expand(FakeStore(), [0], IrisSettings(max_expand_per_seed=1)) == [1]
  assert expand(FakeStore(), [0], IrisSettings(expand_hops=2)) == [1, 3, 8]


def test_oracle_verdicts_and_stops_follow_the_evidence_labels():
  """The oracle's labels, confidences and stop decisions come from the evidence labels, which is
  what an oracle may know. Its note is not: with a store it is the missing evidence turns'
  verbatim text, which the refiner copies into the next query. That is label leakage (the gold
  evidence fed into the retrieval the oracle is meant to bound), so this "ceiling" is not one of
  what a judge's diagnosis can drive. The note checks below pin the leak, not a feature; they
  are to change when the oracle is replaced."""
  store = FakeStore()
  question = "Where did Caroline go to the support group?"
  result = iris_retrieve(store, question, judge=OracleJudge(["D1:1", "D2:2"], store))
  # By hand: iteration 1 shows facts 0 and 1 (searched, both of D1:1) and 3 (an edge from 0, of
  # D1:3), so 1 of the 2 evidence turns is covered (PARTIAL at 1/2, tiered to 0.5); iteration 2
  # shows fact 5 of D2:2 as well: EXACT at 1, above the stop bar of 0.7, so the loop stops.
  assert result.trace[0].shown == (0, 1, 3)
  assert 5 in result.trace[1].shown
  assert [(t.verdict.label, t.verdict.confidence, t.confidence) for t in result.trace] == [
      ("PARTIAL", 0.5, 0.5), ("EXACT", 1.0, 1.0)]
  assert result.iterations == 2 and result.stopped and not result.abstained
  assert (result.label, result.confidence, result.missing) == ("EXACT", 1.0, "")
  assert result.trace[0].query is None
  # LABEL LEAKAGE, pinned so that it stays visible: the second query holds words of D2:2's
  # gold text ("My grandmother gave me a necklace from Sweden.") that neither the question nor
  # the evidence shown so far contains; two of them are what reaches fact 5 ("received necklace
  # from grandmother").
  leaked = {"grandmother", "gave", "necklace", "sweden"}
  shown_words = set().union(*(_tokens(f"{FACTS[f][1]} {FACTS[f][2]}")
                              for f in result.trace[0].shown))
  assert leaked <= set(result.trace[1].query.split())
  assert not leaked & (_tokens(question) | shown_words)
  # The same labels without the gold text (a note of turn ids alone, no store): the verdicts
  # are the same fractions, the loop never gets to D2:2 and runs all 3 iterations. The gap
  # between the two runs is what the leak buys.
  ids_only = iris_retrieve(FakeStore(), question, judge=OracleJudge(["D1:1", "D2:2"]))
  assert [(t.verdict.label, t.verdict.confidence) for t in ids_only.trace] == [
      ("PARTIAL", 0.5)] * 3
  assert not ids_only.stopped and not ids_only.abstained and "D2:2" not in ids_only.turn_ids
  found_at_once = iris_retrieve(FakeStore(), question, judge=OracleJudge(["D1:1"], store))
  assert found_at_once.iterations == 1 and found_at_once.stopped
  anchor_only = iris_retrieve(FakeStore(), question, judge=OracleJudge(["D1:1", "D2:2"], store),
                              settings=IrisSettings(use_refinement_path=False))
  assert anchor_only.iterations == 3 and not anchor_only.stopped
  assert "D2:2" not in anchor_only.turn_ids


def test_stops_at_max_iterations_and_abstains_when_evidence_stays_absent():
  judge = FixedJudge(PARTIAL)
  result = iris_retrieve(FakeStore(), "What is Caroline's favourite xylophone?", judge=judge)
  assert result.iterations == 3 and len(judge.shown) == 3
  assert result.abstained and not result.stopped
  unreachable = iris_retrieve(FakeStore(), "xylophone", judge=OracleJudge(["D9:9"]))
  assert unreachable.abstained and unreachable.missing == "D9:9"
  sure_gap = FixedJudge(Verdict("PARTIAL", 0.9, ""))  # confident, but still insufficient
  assert iris_retrieve(FakeStore(), "xylophone", judge=sure_gap,
                       settings=IrisSettings(use_tiered_confidence=False)).iterations == 3
  some = iris_retrieve(FakeStore(), "xylophone", judge=FixedJudge(Verdict("PARTIAL", 0.4, "")))
  assert some.iterations == 3 and not some.abstained and not some.stopped


def test_temporal_questions_use_the_temporal_schedule_and_threshold():
  question = "When did Caroline attend the support group?"
  assert is_temporal(question) and is_temporal("What did she do?", "temporal")
  assert not is_temporal("What did Caroline attend?", "single-hop")
  judge = FixedJudge(Verdict("PARTIAL", 0.3, "the date"))
  result = iris_retrieve(FakeStore(), question, judge=judge)
  second, third = result.trace[1].query.split(), result.trace[2].query.split()
  assert {"date", "when", "year", "may"} <= set(second) and "before" in third
  generic = iris_retrieve(FakeStore(), question, judge=judge,
                          settings=IrisSettings(use_temporal_schedule=False))
  assert generic.trace[1].query.split()[0] == "caroline" and "january" not in generic.trace[1].query
  inferred = FixedJudge(Verdict("INFERRABLE", 0.8, ""))
  flat = IrisSettings(use_tiered_confidence=False)
  assert iris_retrieve(FakeStore(), question, judge=inferred, settings=flat).iterations == 3
  assert iris_retrieve(FakeStore(), "What did Caroline attend?", judge=inferred,
                       settings=flat).iterations == 1
  assert iris_retrieve(FakeStore(), "What did Caroline attend?", category="temporal",
                       judge=inferred, settings=flat).iterations == 3
  # Tiered: EXACT is floored at 0.85, so it clears the temporal bar; INFERRABLE is capped below.
  exact = FixedJudge(Verdict("EXACT", 0.6, ""))
  assert iris_retrieve(FakeStore(), question, judge=exact).iterations == 1
  assert iris_retrieve(FakeStore(), question, judge=inferred).iterations == 3


def test_entity_buffers_add_facts_of_a_thinly_covered_entity():
  question = "Did Melanie enjoy the charity race?"
  assert named_entities(question) == ["Melanie"]
  settings = IrisSettings(max_iterations=1, use_edges=False, use_entity_buffers=True)
  result = iris_retrieve(FakeStore(), question, judge=FixedJudge(PARTIAL), settings=settings)
  assert result.trace[0].thin_entities == ("Melanie",)
  assert result.trace[0].buffered == (2, 7, 9) and result.fact_ids == (4, 2, 7, 9)
  off = IrisSettings(max_iterations=1, use_edges=False, use_entity_buffers=False)
  assert iris_retrieve(FakeStore(), question, judge=FixedJudge(PARTIAL),
                       settings=off).fact_ids == (4,)
  covered = IrisSettings(max_iterations=1, use_edges=False, min_facts_per_entity=1,
                         use_entity_buffers=True)
  assert iris_retrieve(FakeStore(), question, judge=FixedJudge(PARTIAL),
                       settings=covered).fact_ids == (4,)


def test_llm_judge_reads_valid_and_marks_malformed_replies():
  store = FakeStore()
  llm = ScriptedLLM([{"label": "EXACT", "confidence": 0.9, "missing": ""}, "no json here",
                     LLMError("down")])
  judge = LLMJudge(llm)
  facts = [store.fact(0), store.fact(1)]
  raws = {"D1:1": store.raw("D1:1")}
  assert judge.judge("Where did Caroline go?", facts, raws) == Verdict("EXACT", 0.9, "")
  shown = llm.requests[0].messages[-1]["content"]
  assert "[1] [8 May 2023] Caroline: attended" in shown and "support group yesterday" in shown
  assert shown.count("yesterday") == 1  # the turn shown once, beside its first fact
  bad = judge.judge("Where did Caroline go?", facts, raws)
  assert (bad.label, bad.confidence, bad.malformed) == ("PARTIAL", 0.0, True)
  assert judge.judge("Where did Caroline go?", facts, raws).malformed
  loop_llm = ScriptedLLM([{"label": "PARTIAL", "confidence": 0.3, "missing": "the necklace"},
                          {"label": "EXACT", "confidence": 0.95, "missing": ""}])
  result = iris_retrieve(store, "Where did Caroline go to the support group?",
                         judge=LLMJudge(loop_llm))
  assert result.iterations == 2 and "necklace" in result.trace[1].query
  assert [t.reward for t in result.trace] == [pytest.approx(-0.7), pytest.approx(0.95)]


def test_evidence_is_deduplicated_and_turns_ranked_by_first_appearance():
  assert merge_by_rank([[1, 2, 3], [2, 4]]) == [1, 2, 4, 3]
  settings = IrisSettings(max_iterations=2, refine_from_first=True, use_edges=False)
  result = iris_retrieve(FakeStore(), "support group adoption", judge=FixedJudge(PARTIAL),
                         settings=settings)
  # All four searches (anchor and refinement, twice) return facts 0, 1, 3 and 8: each is kept
  # once, equal scores in the store's id order.
  assert result.fact_ids == (0, 1, 3, 8)
  assert result.turn_ids == ("D1:1", "D1:3", "D3:1")  # facts 0 and 1 share D1:1
  # Counted by hand: fact 8 shares 3 words with the query (adoption, interview, august), facts
  # 0 (lgbtq, support) and 3 (adoption, agencies) 2 each, fact 1 (support) 1. Their turns come
  # D3:1, D1:1, D1:3, then D1:1 again: by first appearance, neither sorted nor by last.
  interleaved = iris_retrieve(FakeStore(), "adoption interview august lgbtq support agencies",
                              judge=FixedJudge(PARTIAL),
                              settings=IrisSettings(max_iterations=1, use_edges=False))
  assert interleaved.fact_ids == (8, 0, 3, 1)
  assert interleaved.turn_ids == ("D3:1", "D1:1", "D1:3")
  assert interleaved.top_turns(2) == ("D3:1", "D1:1")


def test_a_reranker_reorders_the_evidence_the_judge_sees():
  judge = FixedJudge(PARTIAL)
  settings = IrisSettings(max_iterations=1, use_entity_buffers=False)
  result = iris_retrieve(FakeStore(), "support group adoption", judge=judge, settings=settings,
                         reranker=lambda q, facts: [f.fact_id for f in facts])
  assert list(result.fact_ids) == sorted(result.fact_ids, reverse=True)
  assert judge.shown[0] == list(result.fact_ids) == list(result.trace[0].shown)


@final
class SlowRefiner(QueryRefiner):
  """The rule refiner, taking sleep_s per query."""

  def __init__(self, sleep_s: float):
    self.sleep_s = sleep_s

  def refine(self, request: RefineRequest) -> str:
    time.sleep(self.sleep_s)
    return RuleRefiner().refine(request)


def test_timing_fields_split_the_call_into_retrieval_refinement_and_judging():
  store, search_s, refine_s, judge_s = FakeStore(), 0.01, 0.02, 0.03
  search = store.search

  def slow_search(query: str, k: int) -> list[tuple[int, float]]:
    time.sleep(search_s)
    return search(query, k)

  store.search = slow_search
  start = time.perf_counter()
  result = iris_retrieve(store, "support group", judge=FixedJudge(PARTIAL, sleep_s=judge_s),
                         refiner=SlowRefiner(refine_s), settings=IrisSettings(max_iterations=2))
  wall = time.perf_counter() - start
  first, second = result.trace
  # One search per iteration (the anchor at the deepest budget, then the refined query), each
  # inside that iteration's retrieval time; the refiner runs in iteration 2 alone.
  assert [k for _, k in store.searches] == [13, 13]
  assert first.retrieval_s >= search_s and second.retrieval_s >= search_s
  assert first.refine_s == 0.0 and second.refine_s >= refine_s
  assert first.judge_s >= judge_s and second.judge_s >= judge_s
  # The three are disjoint spans of the call: were judging or refining also counted in
  # retrieval_s, the sum would exceed the wall clock by at least that sleep.
  assert result.retrieval_s + result.refine_s + result.judge_s <= wall
  assert result.retrieval_s == pytest.approx(first.retrieval_s + second.retrieval_s)
  assert result.refine_s == pytest.approx(second.refine_s)
  assert result.judge_s == pytest.approx(first.judge_s + second.judge_s)


def test_verdict_reward_orders_the_labels():
  assert verdict_reward("EXACT", 1.0) == 1.0
  assert verdict_reward("INFERRABLE", 0.8) == pytest.approx(0.4)
  assert verdict_reward("PARTIAL", 0.0) == -1.0 and verdict_reward("PARTIAL", 0.5) == -0.5


def test_heuristic_judge_scores_coverage():
  store = FakeStore()
  judge = HeuristicJudge()
  question = "When did Caroline attend the support group?"
  raws = {"D1:1": store.raw("D1:1")}
  assert judge.judge(question, [store.fact(0)], raws) == Verdict("EXACT", 1.0, "")
  undated = judge.judge(question, [store.fact(0)], {})  # the session-date prefix does not count
  assert undated.label == "INFERRABLE" and undated.missing == "a date or time"
  assert undated.confidence == pytest.approx(5 / 7)
  other = judge.judge("What does Caroline research?", [store.fact(2)], {})
  assert other.label == "PARTIAL" and "Caroline" in other.missing and "research" in other.missing
  assert judge.judge(question, [], {}).confidence == 0.0


def test_oracle_judge_labels_by_the_evidence_turns_covered():
  store = FakeStore()
  evidence = ("D1:1", "D2:2", "D3:1")
  oracle = OracleJudge(evidence, store)
  # Every subset of the store's facts, against a naive count of the evidence turns it covers.
  for mask in range(1 << len(FACTS)):
    shown = [store.fact(i) for i in range(len(FACTS)) if mask >> i & 1]
    covered = sum(any(FACTS[f.fact_id][3] == turn for f in shown) for turn in evidence)
    verdict = oracle.judge("q", shown, {})
    if covered == 3:
      assert (verdict.label, verdict.confidence, verdict.missing) == ("EXACT", 1.0, ""), mask
    else:
      assert verdict.label == "PARTIAL", mask
      assert verdict.confidence == pytest.approx(covered / 3), mask
  # Listed twice, an evidence turn counts once: fact 0 covers 1 of 2 turns, not 2 of 3.
  assert OracleJudge(["D1:1", "D1:1", "D2:2"]).judge("q", [store.fact(0)], {}).confidence == 0.5
  assert OracleJudge([]).judge("q", [], {}).label == "EXACT"  # nothing to find: vacuously all
  # LABEL LEAKAGE, pinned so that it stays visible: the note is the missing evidence turns
  # themselves (ids without a store, verbatim gold text with one), which IRIS's refiner then
  # searches for. An oracle with this note bounds nothing a real judge could do.
  partial = oracle.judge("q", [store.fact(0)], {})
  assert partial.missing == ("Caroline: My grandmother gave me a necklace from Sweden. "
                             "Caroline: The adoption interview is in August.")
  assert OracleJudge(evidence).judge("q", [store.fact(0)], {}).missing == "D2:2; D3:1"


def test_fused_order_lets_a_refined_search_hit_rise_above_first_neighbours():
  from rmmjax.retrieve.iris import IterationTrace, fused_order
  facts = [Fact(i, "s", "p", "o", "t", f"T{i}", "S1", f"fact {i}") for i in range(5)]
  verdict = None

  def it(anchor, refine, expanded):
    return IterationTrace(1, 10, None, anchor, refine, expanded, (), (), (), verdict, 0.0,
                          0.0, 0.0, 0.0, 0.0)

  # Entry order: anchor hits 0, 1; their neighbour 2; then refinement hits 3 and 1.
  trace = [it((0, 1), (), (2,)), it((0, 1), (3, 1), ())]
  order = [f.fact_id for f in fused_order(facts[:4], trace)]
  assert order == [1, 0, 3, 2]  # 1 found by both searches; 3 by one; 2 by none, last


def test_feedback_terms_are_frequent_in_the_evidence_and_absent_from_the_question():
  from rmmjax.retrieve.refine import feedback_terms
  texts = ["Melanie: I love pottery and camping", "Melanie: pottery class again",
           "Caroline: camping trip with pottery friends"]
  assert feedback_terms("What does Melanie do?", texts, 2) == ("pottery", "camping")
  assert feedback_terms("What does Melanie do?", texts, 0) == ()
