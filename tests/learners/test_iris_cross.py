"""The cross reranker inside IRIS: its scores of IRIS's facts against the core's scoring of the
same pairs, each (question, fact) pair read once per question, the episodes' pair tokens, and
`train --set variant=cross --set units=lace` then `eval --units lace --iris --reranker`."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from safetensors.numpy import load_file, save_file

from cli_args import sets as _sets
from rmmjax import core
from rmmjax.learners.cross import CrossModel, cross_scores, init_cross_params
from rmmjax.cli import main
from rmmjax.encode.encoder import SentenceEncoder
from rmmjax.eval import iris_eval
from rmmjax.learners.cross.pairs import pair_tokens
from rmmjax.learners.iris.cross_facts import CrossFactReranker, episode_scores, with_pair_tokens
from rmmjax.learners.iris.episodes import IrisEpisode, fuse_with_order
from rmmjax.retrieve.evidence import Fact

pytestmark = pytest.mark.usefixtures("tiny_encoder")  # a tiny BERT: the logic is the point

K = 4
TEXTS = ["[9 May 2023] Ana: signed up for a pottery class", "[9 May 2023] Ben: sister is a potter",
         "", "[20 June 2023] Ben: drove to the coast to watch whales " * 6,
         "[2 July 2023] Ana: made a small whale in pottery class",
         "[2 July 2023] Ben: walked Biscuit to the coast"]
FACTS = [Fact(i, "x", "said", t, "2023", f"D{i}", "S1", t) for i, t in enumerate(TEXTS)]
QUESTION = "What did Ana make in her pottery class?"


@pytest.fixture(scope="module")
def encoder(tiny_encoder):
  return SentenceEncoder(cache=None)


@pytest.fixture(scope="module")
def trained(encoder):
  """A cross reranker with a scoring layer far from zero, so every pair scores differently."""
  params = init_cross_params(dict(encoder.params), K, prior_scale=1.0)
  rng = np.random.default_rng(0)
  params["encoder"]["classifier"]["kernel"] = rng.normal(0, 0.5, (encoder.dim, 1)).astype(
      np.float32)
  spec = core.CoreSpec(variant="cross", dim=encoder.dim, k=K, m=2, batch=2, 
                       model=CrossModel(encoder.cfg))
  return params, spec


def _core_scores(params, spec, tokenizer, question, facts, max_length=48):
  """The core's scores of these facts at positions 0.., padded to the bucket of the longest."""
  texts = [f.text for f in facts] + [None] * (spec.k - len(facts))
  pairs = pair_tokens(tokenizer, [question], [texts], max_length)
  scores = cross_scores(params, pairs.packed(), spec.model.bert)
  return np.asarray(scores)[0, :len(facts)]


def test_iris_facts_score_as_the_core_scores_their_pairs(encoder, trained):
  params, spec = trained
  ranker = CrossFactReranker(params, spec, encoder.tokenizer, 48, mode="alone")
  head = FACTS[:K]  # an empty text and one cut to 48 tokens among them
  scores = ranker(QUESTION, FACTS[:K + 2])
  np.testing.assert_allclose(scores[:K], _core_scores(params, spec, encoder.tokenizer, QUESTION,
                                                      head), atol=1e-4)
  assert scores[K] < min(scores[:K]) and scores[K + 1] < scores[K]  # the tail, in its order
  assert ranker.pairs_read == K
  # A new order with one new fact: only it is read; the others keep their pair score and take
  # the prior of their new position.
  order = [FACTS[5], FACTS[2], FACTS[0], FACTS[3]]
  np.testing.assert_allclose(ranker(QUESTION, order), _core_scores(
      params, spec, encoder.tokenizer, QUESTION, order), atol=1e-4)
  assert ranker.pairs_read == K + 1
  # Another question reads its pairs afresh.
  ranker("Where did Ben go?", order)
  assert ranker.pairs_read == 2 * K + 1
  fused = CrossFactReranker(params, spec, encoder.tokenizer, 48, mode="fused")(QUESTION, head)
  np.testing.assert_allclose(fused, fuse_with_order(np.asarray(scores[:K])), atol=1e-9)
  assert ranker(QUESTION, []) == []


def test_episodes_carry_their_pairs_and_score_in_batches(encoder, trained):
  params, spec = trained
  episodes = [IrisEpisode(QUESTION, "single-hop", tuple(FACTS[i:i + n]), {},
                          np.zeros(encoder.dim, np.float32),
                          np.zeros((K, encoder.dim), np.float32),
                          np.zeros((K, 1), bool), 1) for i, n in ((0, 4), (2, 3), (1, 4))]
  with_tokens, counts = with_pair_tokens(episodes, encoder.tokenizer, 48)
  assert counts["pairs"] == 11 and counts["truncated"] == 3  # the long text, in each one
  assert not with_tokens[1].inputs.segments_BxKxL[3].any()  # a missing fact has no tokens
  # Three episodes in batches of two (the last padded): each row as the core scores it alone.
  scores = episode_scores(params, spec, with_tokens)
  assert scores.shape == (3, K)
  for e, row in zip(with_tokens, scores):
    n = len(e.facts)
    np.testing.assert_allclose(row[:n], _core_scores(params, spec, encoder.tokenizer, QUESTION,
                                                     e.facts), atol=1e-4)


SMALL = ("learner=cross", "units=lace", "dim=32", "holdout=1", "k=6", "m=2", "batch=2", "steps=2",
         "log_every=1", "checkpoint_every=2", "max_length=48",
         "pretrain_candidates=4", "pretrain_epochs=1")


def keep_order(question, facts):
  """A reranker that keeps the order it is given."""
  return [-float(i) for i in range(len(facts))]


@pytest.mark.slow  # the command line end to end: train, eval five times, export
def test_train_a_cross_reranker_on_iris_evidence_then_evaluate_it_inside_iris(
    three, tmp_path, capsys, monkeypatch):
  wd = tmp_path / "run"
  # A prior that starts decreasing stays so through these few steps, so with the head at zero
  # the trained model keeps the order it is handed (checked below); one that starts flat (the
  # default) learns an order of its own from the first steps.
  assert main(["train", "--config", "locomo", "--workdir", str(wd), "--quiet",
               *_sets(f"data={three}", *SMALL, "prior_scale=1.0")]) == 0
  record = json.loads((wd / "record.json").read_text())
  summary = json.loads((wd / "summary.json").read_text())
  assert record["variant"] == "cross" and record["units"] == "lace"
  assert summary["cross_pairs"] == record["cross"]["pairs"] > 0
  assert 0 < summary["cross_pairs_truncated"] < summary["cross_pairs"]
  # A fresh cross reranker scores by its rank prior alone: IRIS's own order, fused or not.
  assert summary["recall_at_m_first"] == pytest.approx(summary["recall_at_m_base"])
  assert len(json.loads((wd / "pretrain.json").read_text())["loss"]) > 0
  def evaluate(*reranker) -> dict:
    out = tmp_path / "report.json"
    assert main(["eval", "--data", str(three), "--units", "lace", "--iris", *reranker,
                 "--k", "1,3,5", "--quiet", "--out", str(out)]) == 0
    return json.loads(out.read_text())

  report = evaluate("--reranker", str(wd))
  assert report["config"]["conversations"] == ["syn-3"]
  assert report["config"]["rerank_mode"] == "fused"
  # The same model with its scoring layer at zero scores by its prior alone, which keeps the
  # order IRIS hands it (fused with that order or not): every number equals those of IRIS with
  # a reranker that keeps the order it is given, computed here apart; with a head far from
  # zero they differ. (IRIS hands a reranker its evidence fused over the searches before each verdict,
  # so such a reranker is not IRIS's own order: experiments/iris_cross.py reports both.)
  served = tmp_path / "served"
  assert main(["export", "--workdir", str(wd), "--out", str(served)]) == 0
  weights = load_file(str(served / "model.safetensors"))
  head = weights["classifier.weight"]

  def served_with(head_weights) -> dict:
    save_file(weights | {"classifier.weight": head_weights}, str(served / "model.safetensors"),
              metadata={"format": "pt"})
    return evaluate("--reranker", str(served))

  ranks = lambda r: {k: v for k, v in r["metrics"]["overall"].items()  # noqa: E731
                     if k.startswith(("recall", "ndcg", "mrr"))}
  prior_only = served_with(np.zeros_like(head))
  with monkeypatch.context() as patch:
    patch.setattr(iris_eval, "fact_reranker", lambda *args: keep_order)
    kept = evaluate("--reranker", str(wd))
  assert ranks(prior_only) == ranks(kept) and len(ranks(kept)) >= 6
  rng = np.random.default_rng(0)
  assert ranks(served_with(rng.normal(0, 3.0, head.shape).astype(np.float32))) != ranks(kept)
  # Another tokenizer is refused, naming both.
  other = tmp_path / "other"
  shutil.copytree(wd, other)
  record["cross"]["tokenizer"] = "0" * 64
  (other / "record.json").write_text(json.dumps(record))
  capsys.readouterr()
  assert main(["eval", "--data", str(three), "--units", "lace", "--iris", "--reranker",
               str(other), "--quiet"]) == 2
  assert "000000000000" in capsys.readouterr().err
