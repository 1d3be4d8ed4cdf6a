"""cross.observations: LoCoMo's observations (per session and speaker, statements naming the
turn they come from) read leniently, joined to the training conversations' questions only;
where the file has none, gone without (auto, the default) or refused before anything is
written (true)."""

import json

import pytest

from cli_args import sets as _sets
from rmmjax.cli import main
from hash_encoder import HashEncoder
from rmmjax.config import apply_overrides, encoder_stage, get_config
from rmmjax.data.locomo import MalformedData, load_locomo, load_observations
from rmmjax.replay.inputs import replay_inputs, with_observations


def _with_observations(three, tmp_path):
  """The three synthetic conversations, each given one observation per session naming that
  session's first turn, and the first also given items of every other shape."""
  records = json.loads(three.read_text())
  for record in records:
    chat = record["conversation"]
    record["observation"] = {
        f"session_{n}_observation": {"A": [[f"what {record['sample_id']} said in {n}",
                                            chat[f"session_{n}"][0]["dia_id"]]]}
        for n in range(1, 5)}
  first = records[0]["observation"]["session_1_observation"]
  turn, other = (records[0]["conversation"]["session_1"][j]["dia_id"] for j in (1, 2))
  first["B"] = [[" two turns at once ", [turn, other]], ["a turn of no session", "D99:1"],
                ["text alone"], [3, turn], "not a list", ["  ", turn], ["an id list", [7]]]
  records[1]["observation"]["session_2_observation"] = "not an object"
  path = tmp_path / "observed.json"
  path.write_text(json.dumps(records))
  return path, records


def test_observations_are_read_leniently_and_matched_to_their_turns(three, tmp_path):
  path, records = _with_observations(three, tmp_path)
  conversations, _ = load_locomo(path)
  found = load_observations(path, conversations)
  assert sorted(found) == ["syn-1", "syn-2", "syn-3"]
  assert [len(found[c]) for c in ("syn-1", "syn-2", "syn-3")] == [5, 3, 4]
  first_turns = [records[0]["conversation"][f"session_{n}"][0]["dia_id"] for n in range(1, 5)]
  turn, other = (records[0]["conversation"]["session_1"][j]["dia_id"] for j in (1, 2))
  assert [(q.question, q.evidence) for q in found["syn-1"]] == [  # in the file's order
      ("what syn-1 said in 1", (first_turns[0],)), ("two turns at once", (turn, other)),
      *((f"what syn-1 said in {n}", (first_turns[n - 1],)) for n in range(2, 5))]
  assert {q.category for qs in found.values() for q in qs} == {"observation"}
  # The questions the loader reads are not touched by the field.
  assert [c.questions for c in conversations] == [c.questions for c in load_locomo(three)[0]]


def test_the_training_conversations_alone_gain_their_observations(three, tmp_path):
  path, _ = _with_observations(three, tmp_path)
  conversations, _ = load_locomo(path)
  found = load_observations(path, conversations)
  cfg = apply_overrides(get_config("locomo"), [f"data={path}", "learner=query_encoder,cross", "folds=3",
                                               "fold=1", "cross.observations=true"])
  joined = with_observations(path, conversations, cfg)
  assert joined[1] == conversations[1]  # held out: its questions alone
  for i in (0, 2):
    assert joined[i].questions == conversations[i].questions + found[joined[i].conversation_id]
    assert joined[i].sessions == conversations[i].sessions


def test_the_encoder_stage_of_a_cross_run_reads_the_questions_alone(three, tmp_path):
  """learner=both tunes its query encoder on the questions; the observations are the cross
  reranker's."""
  path, _ = _with_observations(three, tmp_path)
  cfg = apply_overrides(get_config("locomo"), [f"data={path}", "learner=query_encoder,cross", "dim=32",
                                               "holdout=1", "cross.observations=true"]).validate()
  questions = lambda c: [len(x.questions) for x in replay_inputs(c, HashEncoder())[1]]  # noqa: E731
  plain = [len(c.questions) for c in load_locomo(path)[0]]
  assert questions(cfg) == [plain[0] + 5, plain[1] + 3, plain[2]]
  assert questions(encoder_stage(cfg).validate()) == plain


def test_observations_need_turns_and_one_record_per_conversation(three, tmp_path):
  path, records = _with_observations(three, tmp_path)
  with pytest.raises(ValueError, match="expected units=turn, not session"):
    apply_overrides(get_config("locomo"), [f"data={path}", "learner=query_encoder,cross", "units=session",
                                           "cross.observations=true"]).validate()
  records[2]["sample_id"] = records[0]["sample_id"]
  path.write_text(json.dumps(records))
  with pytest.raises(MalformedData, match="'syn-1' is given to more than one conversation"):
    load_observations(path, load_locomo(path)[0])
  # Refused by true; under auto (the default) the run goes without them.
  conversations = load_locomo(path)[0]
  for value, plain in (("true", False), ("auto", True)):
    cfg = apply_overrides(get_config("locomo"), [f"data={path}", "learner=query_encoder,cross", "holdout=1",
                                                 f"cross.observations={value}"])
    if plain:
      assert with_observations(path, conversations, cfg) == conversations
    else:
      with pytest.raises(MalformedData, match=r"cross.observations=true: .* is given to more "
                                              "than one conversation.*; cross.observations=auto "
                                              "trains without them"):
        with_observations(path, conversations, cfg)


@pytest.mark.parametrize("split, which", [
    (("holdout=1",), "the training conversations (syn-1, syn-2) in "),
    (("folds=3", "fold=1"), "the training conversations of fold=1 of folds=3 (syn-1, syn-3) in ")])
def test_a_file_without_observations_is_refused_before_anything_is_written(three, tmp_path,
                                                                           capsys, split, which):
  wd = tmp_path / "run"
  assert main(["train", "--config", "locomo", "--workdir", str(wd), "--quiet",
               *_sets(f"data={three}", "learner=cross", *split,
                      "cross.observations=true")]) != 0
  err = capsys.readouterr().err
  assert which in err and "hold no observations" in err
  assert not wd.exists()


@pytest.mark.slow
@pytest.mark.usefixtures("tiny_encoder")
def test_a_cross_run_pretrains_on_its_observations_too(three, tmp_path, capsys):
  path, _ = _with_observations(three, tmp_path)
  summaries, said = {}, {}
  for on, data in (("false", path), ("true", path), ("auto", path), ("auto-none", three)):
    wd = tmp_path / on
    assert main(["train", "--config", "locomo", "--workdir", str(wd), "--quiet", *_sets(
        f"data={data}", "learner=cross", "dim=32", "holdout=1", "k=5",
        "m=2", "batch=2", "steps=0", "max_length=48", "pretrain_candidates=4",
        "pretrain_epochs=1", f"cross.observations={on.split('-')[0]}")]) == 0
    summaries[on] = json.loads((wd / "summary.json").read_text())
    said[on] = [line for line in capsys.readouterr().out.splitlines() if "observations" in line]
  # The two training conversations' 5 + 3 observations, each paired with its k candidates.
  assert summaries["true"]["cross_pairs"] - summaries["false"]["cross_pairs"] == 8 * 5
  assert summaries["true"]["eval_queries"] == summaries["false"]["eval_queries"]
  # auto (the default) reads a file's observations as true does, and counts them; where the
  # file has none it says so; false does not look.
  assert ([summaries[on].get("cross_observations") for on in summaries]
          == [None, 8, 8, 0])
  assert summaries["auto"]["cross_pairs"] == summaries["true"]["cross_pairs"]
  assert said == {
      "false": [], "true": ["LoCoMo observations trained on beside the questions: 8 "
                            "(cross.observations=true)"],
      "auto": ["LoCoMo observations trained on beside the questions: 8 "
               "(cross.observations=auto)"],
      "auto-none": ["LoCoMo observations trained on beside the questions: 0 "
                    "(cross.observations=auto; the training conversations hold none, or the "
                    "file gives a conversation id twice)"]}


@pytest.mark.parametrize("overrides", [(), ("units=session",), ("cross.observations=false",)])
def test_auto_trains_without_observations_where_there_are_none_to_read(three, tmp_path,
                                                                       overrides):
  """A file without them, or a run they cannot join (other units), goes without, where true
  is refused."""
  observed, _ = _with_observations(three, tmp_path)
  for path in (three, observed) if overrides else (three,):
    cfg = apply_overrides(get_config("locomo"), [f"data={path}", "learner=query_encoder,cross", "dim=32",
                                                 "holdout=1", *overrides]).validate()
    assert cfg.cross.observations == ("false" if "cross.observations=false" in overrides
                                      else "auto")
    plain = [len(c.questions) for c in load_locomo(path)[0]]
    assert [len(x.questions) for x in replay_inputs(cfg, HashEncoder())[1]] == plain
  with pytest.raises(ValueError, match="cross.observations='yes' is not one of auto, true, "
                                       "false"):
    apply_overrides(get_config("locomo"), [f"data={three}", "learner=query_encoder,cross",
                                           "cross.observations=yes"]).validate()


def test_the_dev_file_observations_join_each_fold_s_training_side(locomo_path):
  conversations, _ = load_locomo(locomo_path)
  found = load_observations(locomo_path, conversations)
  # Every observation of the dev file names a turn of its conversation.
  assert sum(len(v) for v in found.values()) == sum(
      len(items) for record in json.loads(locomo_path.read_text())
      for by_speaker in record["observation"].values() for items in by_speaker.values())
  cfg = apply_overrides(get_config("locomo"), [f"data={locomo_path}", "learner=query_encoder,cross",
                                               "folds=2", "fold=0", "cross.observations=true"])
  joined = with_observations(locomo_path, conversations, cfg)
  # The default, auto, reads them as true does.
  auto = apply_overrides(get_config("locomo"), [f"data={locomo_path}", "learner=query_encoder,cross",
                                                "folds=2", "fold=0"])
  assert auto.cross.observations == "auto" and auto.cross.reads_observations(auto)
  assert with_observations(locomo_path, conversations, auto) == joined
  added = [len(j.questions) - len(c.questions) for j, c in zip(joined, conversations)]
  assert sorted(i for i, n in enumerate(added) if n == 0) == [0, 1, 2, 3]  # fold 0 held out
  assert all(added[i] == len(found[conversations[i].conversation_id]) > 0 for i in range(4, 8))


@pytest.mark.usefixtures("tiny_encoder")
def test_a_grid_over_observations_sweeps_and_one_that_nothing_trains_on_is_refused(
    three, tmp_path, capsys):
  path, _ = _with_observations(three, tmp_path)
  wd = tmp_path / "sweep"
  args = ["sweep", "--config", "locomo", "--workdir", str(wd), "--dry-run", "--folds", "3",
          "--grid", "cross.observations=false,true", *_sets(
              f"data={path}", "learner=cross", "dim=32", "k=5", "m=2",
              "batch=2", "max_length=48", "pretrain_candidates=4")]
  assert main([*args, "--set", "pretrain_epochs=0", "--set", "steps=0"]) != 0
  assert "nothing would learn" in capsys.readouterr().err
  assert main([*args, "--set", "pretrain_epochs=1", "--set", "steps=0"]) == 0
  assert "2 configurations x 3 folds = 6 runs" in capsys.readouterr().out
  assert not wd.exists()
