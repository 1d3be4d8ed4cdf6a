"""`rmmjax answer` with trained models, as `eval` treats them: the conversations the reranker
(or its query encoder) trained on are left out unless --in-sample, and the report names every
model it used. Against a real bank built by `ingest` and an OpenAI-compatible server on
127.0.0.1."""

import json

import pytest

from chat_server import ChatServer
from cli_args import sets
from rmmjax.cli import main

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server():
  srv = ChatServer(lambda request: json.dumps(
      {"correct": True} if "verdict" in json.dumps(request).lower()
      else {"answer": "an answer", "citations": [1]}))
  yield srv
  srv.close()


@pytest.fixture(scope="module")
def trained(three, tmp_path_factory):
  """A topic reranker trained on syn-1 and syn-2 (syn-3 held out), and a bank of all three."""
  root = tmp_path_factory.mktemp("answer")
  assert main(["train", "--config", "locomo", "--workdir", str(root / "w"), "--quiet",
               *sets(f"data={three}", "learner=linear", "units=topic", "retriever=hybrid", "k=4", "m=2",
                     "holdout=1", "steps=20", "log_every=10", "checkpoint_every=20",
                     "pretrain_epochs=1")]) == 0
  assert main(["ingest", "--data", str(three), "--db", str(root / "bank.sqlite"),
               "--user-per-conversation", "--quiet"]) == 0
  return root


def _answer(three, trained, server, out, *extra):
  return main(["answer", "--data", str(three), "--db", str(trained / "bank.sqlite"),
               "--reranker", str(trained / "w"), "--llm-url", server.url, "--model", "m",
               "--m", "2", "--candidates", "4", "--quiet", "--out", str(out), *extra])


def test_answer_leaves_out_what_its_reranker_trained_on(three, trained, server, tmp_path):
  out = tmp_path / "report.json"
  assert _answer(three, trained, server, out) == 0
  report = json.loads(out.read_text())
  assert {a["conversation"] for a in report["answers"]} == {"syn-3"}
  config = report["config"]
  assert config["excluded_conversations"] == ["syn-1", "syn-2"] and not config["in_sample"]
  assert config["reranker"] == str(trained / "w")
  assert [e["id"] for e in config["reranker_record"]["trained_conversations"]] == [
      "syn-1", "syn-2"]
  assert config["query_encoder"] is None and config["encoder"]


def test_in_sample_answers_every_conversation_and_says_so(three, trained, server, tmp_path):
  out = tmp_path / "report.json"
  assert _answer(three, trained, server, out, "--in-sample", "--limit", "40") == 0
  report = json.loads(out.read_text())
  assert report["config"]["in_sample"]
  assert report["config"]["trained_conversations_in_file"] == ["syn-1", "syn-2"]
  assert "syn-1" in {a["conversation"] for a in report["answers"]}


def test_a_file_of_training_conversations_alone_is_refused(three, trained, server, tmp_path,
                                                           capsys):
  data = json.loads(three.read_text())
  only = tmp_path / "seen.json"
  only.write_text(json.dumps(data[:2]))
  assert main(["answer", "--data", str(only), "--db", str(trained / "bank.sqlite"),
               "--reranker", str(trained / "w"), "--llm-url", server.url, "--model", "m",
               "--m", "2", "--candidates", "4", "--quiet",
               "--out", str(tmp_path / "r.json")]) == 2
  assert "--in-sample" in capsys.readouterr().err
  assert not (tmp_path / "r.json").exists()


def test_a_reranker_over_a_tuned_query_encoder_brings_it(three, server, tmp_path):
  # learner=both: the reranker's candidates came from the query encoder the run tuned first;
  # answer (as recall and chat) loads it from the workdir, as eval does, and says so.
  wd = tmp_path / "both"
  assert main(["train", "--config", "locomo", "--workdir", str(wd), "--quiet",
               *sets(f"data={three}", "learner=query_encoder,linear", "units=topic", "k=4", "m=2",
                     "holdout=1", "steps=20", "log_every=10", "checkpoint_every=20",
                     "pretrain_epochs=1", "encoder_tuning.pretrain_epochs=1",
                     "encoder_tuning.steps=10")]) == 0
  assert main(["ingest", "--data", str(three), "--db", str(tmp_path / "bank.sqlite"),
               "--user-per-conversation", "--quiet"]) == 0
  out = tmp_path / "report.json"
  assert main(["answer", "--data", str(three), "--db", str(tmp_path / "bank.sqlite"),
               "--reranker", str(wd), "--llm-url", server.url, "--model", "m", "--m", "2",
               "--candidates", "4", "--quiet", "--out", str(out)]) == 0
  config = json.loads(out.read_text())["config"]
  assert config["query_encoder"] == str(wd / "query_encoder")
  assert config["query_encoder_identity"] is not None
  assert config["excluded_conversations"] == ["syn-1", "syn-2"]


@pytest.mark.parametrize("extra, flag", [(("--reranker", "W"), "--reranker W"),
                                         (("--encoder", "E"), "--encoder E"),
                                         (("--db", "bank.sqlite"), "--db bank.sqlite"),
                                         (("--candidates", "8"), "--candidates 8")])
def test_answer_iris_refuses_what_it_would_not_use(three, tmp_path, capsys, extra, flag):
  out = tmp_path / "report.json"
  assert main(["answer", "--data", str(three), "--iris", "--llm-url", "http://127.0.0.1:9",
               "--model", "m", "--out", str(out), *extra]) == 2
  err = capsys.readouterr().err
  assert f"{flag}: answer --iris answers from IRIS's evidence" in err
  assert f"drop {flag.split()[0]}" in err
  assert len(err.splitlines()) == 1 and not out.exists()
