"""LoCoMo loading, memory units, BM25 and the evidence metrics, on the real dev file."""

import json
from pathlib import Path

import pytest

from rmmjax.cli import main
from rmmjax.data.locomo import MalformedData, load_locomo, parse_evidence
from rmmjax.data.schema import LoadReport
from rmmjax.retrieve.metrics import aggregate, question_metrics
from rmmjax.retrieve.bm25 import BM25Retriever
from rmmjax.retrieve.units import build_units


def test_evidence_ids_are_parsed_leniently_and_every_repair_counted():
  known = {"D8:6", "D9:17", "D9:1", "D4:4", "D4:6", "D11:26", "D30:5"}
  report = LoadReport()
  assert parse_evidence("D8:6; D9:17", known, report) == ["D8:6", "D9:17"]
  assert parse_evidence("D9:1 D4:4 D4:6", known, report) == ["D9:1", "D4:4", "D4:6"]
  assert parse_evidence("D:11:26", known, report) == ["D11:26"]
  assert parse_evidence("D30:05", known, report) == ["D30:5"]
  assert parse_evidence("D", known, report) == []
  assert parse_evidence("D10:19", known, report) == []
  assert report.counts == {"several evidence ids in one string (split)": 2,
                           "evidence id normalised": 2,
                           "evidence string without an id (dropped)": 1,
                           "evidence id names no turn (dropped)": 1}


def test_locomo_dev_file_loads_with_its_documented_counts(locomo_path):
  conversations, report = load_locomo(locomo_path)
  assert [c.conversation_id for c in conversations] == [
      "conv-26", "conv-30", "conv-41", "conv-42", "conv-43", "conv-44", "conv-47", "conv-48"]
  assert sum(len(c.sessions) for c in conversations) == 217
  assert sum(len(s.turns) for c in conversations for s in c.sessions) == 4805
  # 1,586 questions, of which 2 have no valid evidence and are skipped (and counted).
  assert sum(len(c.questions) for c in conversations) == 1584
  assert report.counts["question without valid evidence (skipped)"] == 2
  assert report.counts["evidence id names no turn (dropped)"] == 2  # D10:19, D4:36
  for conv in conversations:
    ids = conv.turn_ids()
    assert all(set(q.evidence) <= ids for q in conv.questions)
  captions = [t for c in conversations for s in c.sessions for t in s.turns if t.caption]
  assert captions, "image turns keep their captions"


def test_malformed_files_name_file_record_and_field(tmp_path):
  bad = tmp_path / "bad.json"
  bad.write_text(json.dumps([{"sample_id": "x", "conversation": {
      "session_1": [{"speaker": "A", "dia_id": "D1:1"}]}, "qa": []}]))
  with pytest.raises(MalformedData, match=r"bad.json: record 0 \(x\), session_1\[0\]: missing "
                                          r"field 'text'"):
    load_locomo(bad)
  bad.write_text("{not json")
  with pytest.raises(MalformedData, match="not JSON"):
    load_locomo(bad)
  bad.write_text(json.dumps([{"sample_id": "y", "conversation": {}, "qa": []}]))
  with pytest.raises(MalformedData, match="no session with turns"):
    load_locomo(bad)
  with pytest.raises(FileNotFoundError, match="expected a LoCoMo JSON file"):
    load_locomo(tmp_path / "missing.json")


def test_units_cover_every_turn_once_per_granularity(three):
  conv = load_locomo(three)[0][0]
  turns = [t for s in conv.sessions for t in s.turns]
  for granularity, copies in (("turn", 1), ("session", 1), ("mixed", 2)):
    units = build_units(conv, granularity)
    covered = [t for u in units for t in u.turn_ids]
    assert sorted(covered) == sorted([t.turn_id for t in turns] * copies)
    assert all(u.words == len(u.text.split()) > 0 for u in units)
  first = build_units(conv, "turn")[0]
  assert first.text.startswith(f"[{conv.sessions[0].date}] {turns[0].speaker}: ")


def test_metrics_by_hand():
  ranked = [(("a",), 10), (("x", "b"), 20), (("y",), 5), (("c",), 7)]
  m = question_metrics(ranked, {"a", "b", "c"}, num_relevant_units=3, ks=(1, 2),
                       budget_words=32)
  assert m["recall_all@1"] == pytest.approx(1 / 3) and m["recall_any@1"] == 1.0
  assert m["recall_all@2"] == pytest.approx(2 / 3) and m["words@2"] == 30
  dcg = 1 + 1 / 1.5849625007211562 + 1 / 2.321928094887362  # ranks 1, 2 and 4
  idcg = 1 + 1 / 1.5849625007211562 + 1 / 2.0
  assert m["ndcg@10"] == pytest.approx(dcg / idcg)
  assert m["mrr"] == 1.0
  assert m["recall_all@budget"] == pytest.approx(2 / 3) and m["words@budget"] == 30
  miss = question_metrics([(("x",), 3), (("a",), 3)], {"a"}, 1, ks=(1,))
  assert miss["mrr"] == 0.5 and miss["recall_all@1"] == 0.0
  with pytest.raises(ValueError, match="without evidence"):
    question_metrics(ranked, set(), 0, ks=(1,))
  agg = aggregate([("temporal", {"mrr": 1.0}), ("temporal", {"mrr": 0.0}), ("multi-hop",
                                                                             {"mrr": 0.5})])
  assert agg["overall"]["mrr"] == pytest.approx(0.5) and agg["overall"]["questions"] == 3
  assert agg["by_category"]["temporal"] == {"mrr": 0.5, "questions": 2}


def test_bm25_ranks_matching_text_first():
  retriever = BM25Retriever(["Caroline went to a support group", "Melanie painted a sunset",
                             "the weather was mild"])
  assert retriever.rank(["When did Melanie paint?", "support group Caroline"], 2).tolist() == [
      [1, 0], [0, 1]]


def test_eval_command_reproduces_the_bm25_turn_baseline(locomo_path, tmp_path, capsys):
  """BM25 over "[date] Speaker: utterance" turn units: Recall@5 (all) 0.482 in an independent
  measurement on this file; this implementation must land within a point of it."""
  out = tmp_path / "eval.json"
  assert main(["eval", "--dataset", "locomo", "--data", str(locomo_path), "--units", "turn",
               "--retriever", "bm25", "--k", "5,10", "--budget-words", "200",
               "--out", str(out)]) == 0
  result = json.loads(out.read_text())
  overall = result["metrics"]["overall"]
  assert overall["recall_all@5"] == pytest.approx(0.482, abs=0.01)
  assert overall["recall_all@10"] == pytest.approx(0.556, abs=0.01)
  assert overall["recall_any@5"] >= overall["recall_all@5"]
  assert set(result["metrics"]["by_category"]) == {"multi-hop", "temporal", "open-domain",
                                                   "single-hop", "adversarial"}
  for key in ("recall_all@5", "recall_any@5", "ndcg@10", "mrr", "words@5", "recall_all@budget"):
    assert key in result["metrics"]["by_category"]["multi-hop"]
  table = capsys.readouterr().out
  assert "R@5 all" in table and "R all@200w" in table


@pytest.mark.parametrize("flags,message", [
    (["--units", "paragraph"],
     "invalid choice: 'paragraph' (choose from 'turn', 'session', 'mixed'"),
    (["--retriever", "tfidf"], "invalid choice: 'tfidf'"),
    (["--dataset", "msc"], "invalid choice: 'msc' (choose from 'locomo', 'longmemeval')"),
])
def test_eval_offers_only_what_it_can_evaluate(three, capsys, flags, message):
  with pytest.raises(SystemExit) as exit_info:
    main(["eval", "--data", str(three), *flags])
  assert exit_info.value.code == 2
  assert message in capsys.readouterr().err


@pytest.mark.parametrize("k,message", [
    ("five", "expected comma-separated integers"),
    ("0,5", "--k 0,5: expected distinct cut-offs from 1 to 1,000"),
    ("5,5", "--k 5,5: expected distinct cut-offs from 1 to 1,000"),
    ("5,100000", "--k 5,100000: expected distinct cut-offs from 1 to 1,000"),
])
def test_eval_refuses_bad_cutoffs_before_loading_anything(tmp_path, capsys, k, message):
  missing = tmp_path / "not-there.json"  # never read: the cut-offs fail first
  assert main(["eval", "--data", str(missing), "--k", k]) == 2
  assert message in capsys.readouterr().err


PROC = Path("/proc/self")  # a directory in which nobody, root included, can create a file


@pytest.mark.parametrize("make_out,message", [
    (lambda d: d, "is a directory; expected a file name"),
    (lambda d: d / "afile" / "eval.json", "is a file, so no directory can be made there"),
    pytest.param(lambda d: PROC / "eval.json", "is not writable",
                 marks=pytest.mark.skipif(not PROC.is_dir(), reason="no /proc here")),
])
def test_eval_checks_its_output_path_before_the_work(three, tmp_path, capsys, make_out,
                                                      message):
  (tmp_path / "afile").write_text("x")
  out = make_out(tmp_path)
  assert main(["eval", "--data", str(three), "--quiet", "--out", str(out)]) == 2
  err = capsys.readouterr().err
  assert message in err and str(out) in err and "R@5" not in err


@pytest.mark.slow
def test_dense_and_hybrid_retrieval_rank_the_evidence(long_conversation, tmp_path):
  """One conversation end to end with the real encoder: dense and the BM25 fusion find evidence
  far above chance, and fusion is at least as good as the weaker of its two inputs."""
  from rmmjax.encode.encoder import SentenceEncoder
  from rmmjax.eval.retrieval import evaluate_retrieval

  records = json.loads(long_conversation.read_text())
  subset = tmp_path / "one.json"
  record = next(r for r in records if r["sample_id"] == "syn-1")
  subset.write_text(json.dumps([record]))
  encoder = SentenceEncoder()
  recall = {}
  for retriever in ("bm25", "dense", "hybrid"):
    result = evaluate_retrieval("locomo", subset, "turn", retriever, (5,), encoder=encoder)
    recall[retriever] = result["metrics"]["overall"]["recall_all@5"]
  turns = sum(len(s) for k, s in record["conversation"].items()
              if k.startswith("session_") and isinstance(s, list))
  assert recall["dense"] > 20 * 5 / turns  # chance is 5 / turns
  assert recall["hybrid"] >= min(recall["bm25"], recall["dense"])


def test_dense_search_with_the_bank_sharded_over_devices_equals_exhaustive_ranking(
    on_four_devices):
  """On 4 (fake CPU) devices the bank's rows are split across them; the top 20 equal an
  exhaustive NumPy ranking, and the one-device path's."""
  out = on_four_devices("""
      import jax, numpy as np
      from rmmjax.retrieve.dense import search
      assert jax.device_count() == 4
      rng = np.random.default_rng(0)
      bank = rng.standard_normal((1001, 16)).astype(np.float32)  # not a multiple of 4
      q = rng.standard_normal((70, 16)).astype(np.float32)  # two query chunks
      want = np.argsort(-(q @ bank.T), 1, kind="stable")[:, :20]
      np.testing.assert_array_equal(search(q, bank, 20), want)
      np.testing.assert_array_equal(search(q, bank, 20, devices=jax.devices()[:1]), want)
      print("OK", search(q, bank, 20).shape)
  """)
  assert "OK (70, 20)" in out


def test_bm25_ranks_a_query_of_stopwords_only_without_failing():
  retriever = BM25Retriever(["the cat sat on the mat", "a dog ran"])
  assert retriever.rank(["the of and", "dog"], 2).tolist() == [[0, 1], [1, 0]]


def test_eval_names_the_conversations_it_leaves_out_for_having_no_questions(three, tmp_path,
                                                                           capsys):
  records = json.loads(Path(three).read_text())
  records[1]["qa"] = []
  path = tmp_path / "two_asked.json"
  path.write_text(json.dumps(records))
  assert main(["eval", "--data", str(path), "--quiet", "--k", "5"]) == 0
  assert "left out 1 conversation without evidence-labelled questions: syn-2" in capsys.readouterr().out
