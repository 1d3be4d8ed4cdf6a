"""IRIS, iterative retrieval via insufficiency signals, over any `EvidenceStore`: the loop's
paths, budgets, judge and stopping are described in docs/command-line.md (eval --iris).

Entry order: within an iteration, new facts enter as search hits merged by rank (the anchor's
first at equal rank), then their edge neighbours (by seed rank, then edge weight), then
entity-buffer facts, after earlier iterations' facts. A reranker (`reranker(question, facts) ->
scores`) reorders the whole accumulated evidence before each verdict, given in the order the
loop would otherwise end with (`final_order`, over the searches so far; ties keep it).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Literal, final

from rmmjax.retrieve.evidence import EvidenceStore, Fact, RawTurn
from rmmjax.retrieve.fusion import RRF_C
from rmmjax.retrieve.judges import SufficiencyJudge, Verdict, verdict_reward
from rmmjax.retrieve.metrics import MRR_DEPTH
from rmmjax.retrieve.refine import (QueryRefiner, RefineRequest, RuleRefiner, VectorRefiner,
                                    entity_context, feedback_terms, is_temporal, named_entities)

Reranker = Callable[[str, Sequence[Fact]], Sequence[float]]
SINGLE_PASS_DEPTH = MRR_DEPTH  # facts retrieved by one search, to rank turns beyond k


@final
@dataclasses.dataclass(frozen=True)
class IrisSettings:
  """Every threshold, cap and schedule of the loop; each component can be switched off."""

  max_iterations: int = 3
  base_budget: int = 10  # facts per path at iteration 1 (EviMem's code)
  budget_step: int = 3  # more facts per path at each later iteration
  use_refinement_path: bool = True  # off: the anchor alone, re-queried with a growing budget
  refine_from_first: bool = False  # run the refinement path at iteration 1 too (no note yet)
  use_edges: bool = True
  expand_hops: int = 1
  edge_min_weight: float = 0.5
  max_expand_per_seed: int = 3  # strongest neighbours taken per fact, per hop
  # Off by default: on the LoCoMo dev file they added no recall and 30% to the p95 latency
  # (experiments/results/iris_ablation.md).
  use_entity_buffers: bool = False
  min_facts_per_entity: int = 2  # fewer accumulated facts about a named entity is thin coverage
  entity_buffer_size: int = 3  # facts added per thinly covered entity
  entity_search_k: int = 50  # search depth used to rank an entity's facts for the question
  use_temporal_schedule: bool = True  # off: the general schedule for every question
  stop_confidence: float = 0.7
  temporal_stop_confidence: float = 0.85
  abstain_below: float = 0.2  # final PARTIAL below this after the last iteration: abstain
  use_tiered_confidence: bool = True  # EviMem's tiers: EXACT floored, the others capped
  exact_floor: float = 0.85
  inferrable_cap: float = 0.75
  partial_cap: float = 0.5
  # The final ranking without a reranker: "entry" keeps the order facts entered (iteration 1's
  # anchor hits and their neighbours first); "fused" ranks by reciprocal-rank fusion of every
  # search (the last anchor search and each refinement search once), so facts a refined query
  # found can rise above iteration 1's neighbours; facts reached only along edges or by entity
  # buffers rank after every searched fact; "last" puts the last search first (a refinement
  # search by vector, which ranks the facts knowing the first hop's), the rest fused after it.
  final_order: Literal["entry", "fused", "last"] = "fused"
  # Pseudo-relevance feedback: the refined query gains the feedback_terms most frequent terms
  # of the best feedback_facts facts so far that the question lacks (0: off).
  feedback_terms: int = 8
  feedback_facts: int = 5

  def budget(self, iteration: int) -> int:
    """Facts each path retrieves at iteration (1-based): base + step * (iteration - 1)."""
    return self.base_budget + self.budget_step * (iteration - 1)

  def calibrate(self, verdict: Verdict) -> float:
    """The confidence the loop acts on: tiered (EXACT floored, others capped) when switched on."""
    if not self.use_tiered_confidence or verdict.malformed:
      return verdict.confidence
    if verdict.label == "EXACT":
      return max(verdict.confidence, self.exact_floor)
    cap = self.inferrable_cap if verdict.label == "INFERRABLE" else self.partial_cap
    return min(verdict.confidence, cap)


# Named settings. default: EviMem's budgets and thresholds. wide: budgets of 20 + 10 (i - 1)
# that stop only on an EXACT verdict, gathering more of the evidence for a reranker to order
# (on the LoCoMo dev file 142 facts per question holding 0.58 of the multi-hop evidence turns,
# against 49 holding 0.39: experiments/results/iris_reranker.md).
# learned: for a learned refiner and judge (`--iris-model`): two iterations (the second a
# refinement search by vector, which decides the final order), no edges.
IRIS_PRESETS = {
    "default": IrisSettings(),
    "wide": IrisSettings(base_budget=20, budget_step=10, stop_confidence=1.0,
                         temporal_stop_confidence=1.0),
    "learned": IrisSettings(max_iterations=2, budget_step=10, use_edges=False,
                            final_order="last"),
}


@final
@dataclasses.dataclass(frozen=True)
class IterationTrace:
  """What one iteration searched, added, showed and heard back."""

  iteration: int
  budget: int
  query: str | None  # the refinement path's query; None when that path did not run
  anchor_hits: tuple[int, ...]
  refine_hits: tuple[int, ...]
  expanded: tuple[int, ...]  # facts first seen in this iteration reached along edges
  buffered: tuple[int, ...]  # and those added by entity buffers
  thin_entities: tuple[str, ...]
  shown: tuple[int, ...]  # the facts the judge saw, in order: a REINFORCE update's candidates
  verdict: Verdict  # as the judge gave it
  confidence: float  # as the loop acted on it (tiered)
  reward: float  # verdict_reward(label, confidence); 0 for a malformed verdict
  retrieval_s: float
  refine_s: float
  judge_s: float


@final
@dataclasses.dataclass(frozen=True)
class IrisResult:
  fact_ids: tuple[int, ...]  # the final ranked evidence
  turn_ids: tuple[str, ...]  # their source turns, each at its first appearance
  facts: tuple[Fact, ...]
  iterations: int
  stopped: bool  # the judge was confident enough before the iterations ran out
  abstained: bool
  label: str
  confidence: float  # tiered, as the loop acted on it
  missing: str
  trace: tuple[IterationTrace, ...]
  retrieval_s: float  # search, expansion, buffers, store reads, reranking
  refine_s: float  # writing refined queries (an LLM refiner's calls)
  judge_s: float

  def top_turns(self, k: int) -> tuple[str, ...]:
    """The turns of the top-k ranked evidence, for Recall@k over turn ids."""
    return self.turn_ids[:k]


def merge_by_rank(paths: Sequence[Sequence[int]]) -> list[int]:
  """Ids of several ranked lists, best rank first (earlier lists first at equal rank), once."""
  depth = max(map(len, paths), default=0)
  return list(dict.fromkeys(p[rank] for rank in range(depth) for p in paths if rank < len(p)))


def expand(store: EvidenceStore, seeds: Sequence[int], settings: IrisSettings) -> list[int]:
  """Facts within `expand_hops` strong edges of the seeds, not themselves seeds, in entry order."""
  known = dict.fromkeys(seeds)
  frontier, num_seeds = list(seeds), len(known)
  for _ in range(settings.expand_hops if settings.use_edges else 0):
    reached = []
    for seed in frontier:
      links = sorted(store.neighbours(seed, settings.edge_min_weight),
                     key=lambda lw: (-lw[1], lw[0]))
      for fact_id, _ in links[:settings.max_expand_per_seed]:
        if fact_id not in known:
          known[fact_id] = None
          reached.append(fact_id)
    frontier = reached
  return list(known)[num_seeds:]


def entity_buffers(store: EvidenceStore, question: str, have: set[int],
                   settings: IrisSettings) -> tuple[tuple[str, ...], list[int]]:
  """Entities of the question with thin coverage in `have`, and the facts added for them."""
  thin, added = [], []
  for entity in named_entities(question):
    about = store.facts_about(entity)
    if not about or len(set(about) & have) >= settings.min_facts_per_entity:
      continue
    thin.append(entity)
    about_set = set(about)
    # The store's own ranking of the entity within the question, then its remaining facts.
    hits = [f for f, _ in store.search(f"{entity} {question}", settings.entity_search_k)]
    ordered = [f for f in hits if f in about_set] + about
    fresh = [f for f in dict.fromkeys(ordered) if f not in have and f not in added]
    added.extend(fresh[:settings.entity_buffer_size])
  return tuple(thin), added


def fused_order(facts: list[Fact], trace: Sequence["IterationTrace"]) -> list[Fact]:
  """The accumulated facts by reciprocal-rank fusion of the searches that found them (the last
  anchor search, every refinement search); the rest after them, in entry order."""
  return _fuse(facts, trace[-1].anchor_hits,
               [t.refine_hits for t in trace if t.refine_hits and t.refine_hits != t.anchor_hits])


def last_order(facts: list[Fact], trace: Sequence["IterationTrace"]) -> list[Fact]:
  """The last iteration's refinement hits (its anchor hits when it had none) in their order,
  then the other accumulated facts in `fused_order`."""
  lead = trace[-1].refine_hits or trace[-1].anchor_hits
  by_id = {f.fact_id: f for f in facts}
  first = [by_id[f] for f in lead if f in by_id]
  taken = {f.fact_id for f in first}
  return first + [f for f in fused_order(facts, trace) if f.fact_id not in taken]


def _fuse(facts: list[Fact], anchor: Sequence[int],
          refinements: Sequence[Sequence[int]]) -> list[Fact]:
  score: dict[int, float] = {}
  for hits in [anchor, *refinements]:
    for rank, fact_id in enumerate(hits):
      score[fact_id] = score.get(fact_id, 0.0) + 1.0 / (RRF_C + 1.0 + rank)
  return sorted(facts, key=lambda f: -score.get(f.fact_id, 0.0))  # stable: ties in entry order


def iris_retrieve(store: EvidenceStore, question: str, *, category: str | None = None,
                  judge: SufficiencyJudge, settings: IrisSettings = IrisSettings(),
                  refiner: QueryRefiner | None = None,
                  reranker: Reranker | None = None) -> IrisResult:
  """Retrieve evidence for a question from one conversation's `store` iteratively until the
  judge deems it sufficient: the ranked evidence, its turns, the final verdict and a
  per-iteration trace with timings. `category` "temporal" picks the temporal schedule and
  threshold (a question asking when / what date / how long is temporal without it); `refiner`
  defaults to the rule-based one, `reranker` to entry order."""
  refiner = refiner if refiner is not None else RuleRefiner()
  temporal = is_temporal(question, category)
  threshold = settings.temporal_stop_confidence if temporal else settings.stop_confidence
  facts: dict[int, Fact] = {}  # the accumulated evidence, in entry order
  raws: dict[str, RawTurn] = {}
  ranked: list[Fact] = []
  trace: list[IterationTrace] = []
  current_query, missing, refinements, thin = question, "", 0, ()
  refine_lists: list[list[int]] = []  # every refinement search that differed from the anchor's
  stopped = False
  anchor_ranking: list[int] = []
  for iteration in range(1, settings.max_iterations + 1):
    start = time.perf_counter()
    k = settings.budget(iteration)
    if iteration == 1:
      # One anchor search at the largest budget: each iteration's anchor hits are a prefix of
      # it (a search's top k are the first k of its deeper ranking), so the question is
      # embedded and scored once, not once per iteration.
      deepest = settings.budget(settings.max_iterations)
      anchor_ranking = [f for f, _ in store.search(question, deepest)]
    anchor = anchor_ranking[:k]
    query, refined, refine_s = None, [], 0.0
    if settings.use_refinement_path and (iteration > 1 or settings.refine_from_first):
      tick = time.perf_counter()
      top = [f.text.split("] ", 1)[-1] for f in ranked[:settings.feedback_facts]]
      query = refiner.refine(RefineRequest(
          question, current_query, missing, refinements,
          temporal and settings.use_temporal_schedule, entity_context(question, thin),
          feedback_terms(question, top, settings.feedback_terms), tuple(top)))
      vector = (refiner.query_vector(query, store.query_vector(question))
                if isinstance(refiner, VectorRefiner) else None)
      refine_s = time.perf_counter() - tick  # writing and embedding the query
      refinements += 1
      current_query = query
      # A refinement that adds nothing to the question would only repeat the anchor's search.
      same = " ".join(query.lower().split()) == " ".join(question.lower().split())
      if vector is not None:
        refined = [f for f, _ in store.search_vector(vector, k, question)]
      else:
        refined = anchor if same else [f for f, _ in store.search(query, k)]
      if refined and refined != anchor:
        refine_lists.append(refined)
    seeds = merge_by_rank([anchor, refined])
    reached = expand(store, seeds, settings)
    have = set(facts) | set(seeds) | set(reached)
    thin, buffered = (entity_buffers(store, question, have, settings)
                      if settings.use_entity_buffers else ((), []))
    new = [f for f in dict.fromkeys([*seeds, *reached, *buffered]) if f not in facts]
    for fact_id in new:
      fact = facts[fact_id] = store.fact(fact_id)
      if fact.turn_id not in raws:
        raws[fact.turn_id] = store.raw(fact.turn_id)
    ranked = list(facts.values())
    if reranker is not None and ranked:  # it refines the order the loop would end with
      if settings.final_order != "entry":
        ranked = _fuse(ranked, anchor, refine_lists)
      scores = [float(s) for s in reranker(question, ranked)]
      # (sorted is stable: ties keep the order the loop would end with)
      ranked = [ranked[i] for i in sorted(range(len(ranked)), key=lambda i: -scores[i])]
    retrieval_s = time.perf_counter() - start - refine_s
    tick = time.perf_counter()
    verdict = judge.judge(question, ranked, {f.turn_id: raws[f.turn_id] for f in ranked},
                          category=category)
    judge_s = time.perf_counter() - tick
    confidence = settings.calibrate(verdict)
    reward = 0.0 if verdict.malformed else verdict_reward(verdict.label, confidence)
    new_set = set(new)
    trace.append(IterationTrace(
        iteration, k, query, tuple(anchor), tuple(refined),
        tuple(f for f in reached if f in new_set), tuple(f for f in buffered if f in new_set),
        thin, tuple(f.fact_id for f in ranked), verdict, confidence, reward, retrieval_s,
        refine_s, judge_s))
    if verdict.label != "PARTIAL" and confidence >= threshold:
      stopped = True
      break
    missing = verdict.missing
  if reranker is None and settings.final_order != "entry":
    ranked = (fused_order if settings.final_order == "fused" else last_order)(ranked, trace)
  last = trace[-1]
  abstained = (not stopped and last.verdict.label == "PARTIAL"
               and last.confidence < settings.abstain_below)
  return IrisResult(
      fact_ids=tuple(f.fact_id for f in ranked),
      turn_ids=tuple(dict.fromkeys(f.turn_id for f in ranked)), facts=tuple(ranked),
      iterations=len(trace), stopped=stopped, abstained=abstained, label=last.verdict.label,
      confidence=last.confidence, missing=last.verdict.missing, trace=tuple(trace),
      retrieval_s=sum(t.retrieval_s for t in trace), refine_s=sum(t.refine_s for t in trace),
      judge_s=sum(t.judge_s for t in trace))


def single_pass(store: EvidenceStore, question: str, depth: int) -> tuple[list[str], float]:
  """The turns of one search's first `depth` facts in order, and the seconds it took (the
  single-pass baseline IRIS is measured against)."""
  start = time.perf_counter()
  turns = list(dict.fromkeys(store.fact(f).turn_id for f, _ in store.search(question, depth)))
  return turns, time.perf_counter() - start
