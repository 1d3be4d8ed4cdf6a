"""Exports say what they are in their manifest, as workdirs do: a folder given as a model is
read by its manifest, and one of another format, or without one, is refused in one line naming
the format (nothing is guessed from the files it holds)."""

import json

import pytest

from rmmjax.cli import main
from rmmjax.io.kinds import model_kind

FLAGS = {  # the flag of each learner's export, with what it needs beside it
    "reranker": ["--reranker"],
    "both": ["--reranker"],
    "query_encoder": ["--retriever", "hybrid", "--encoder"],
    "iris": ["--units", "lace", "--iris", "learned", "--iris-model"],
}


def _refused(capsys, *argv) -> str:
  assert main(list(argv)) == 2
  err = capsys.readouterr().err
  assert len(err.strip().splitlines()) == 1, err
  return err


def _export(folder, **manifest):
  folder.mkdir()
  (folder / "model.safetensors").write_bytes(b"weights")
  (folder / "rmmjax.json").write_text(json.dumps({"kind": "export"} | manifest))
  return folder


@pytest.mark.parametrize("learner", sorted(FLAGS))
def test_an_export_of_another_format_is_refused_naming_it(three, tmp_path, capsys, learner):
  folder = _export(tmp_path / "exported", format=1, learner=learner)
  err = _refused(capsys, "eval", "--data", str(three), "--quiet", *FLAGS[learner], str(folder))
  assert f"{folder} was written in rmmjax's format 1; this rmmjax reads format 2; export " in err
  assert "export its training workdir again" in _refused(
      capsys, "export", "--workdir", str(folder), "--out", str(tmp_path / "again"))
  assert not (tmp_path / "again").exists()


def test_a_folder_without_a_manifest_is_refused(three, tmp_path, capsys):
  # What an earlier rmmjax exported a cross reranker as: no manifest, whatever else it holds.
  earlier = tmp_path / "earlier"
  earlier.mkdir()
  for name in ("config.json", "model.safetensors", "rmmjax_cross.json"):
    (earlier / name).write_text("{}")
  assert model_kind(earlier) == "no manifest"
  for flags in (FLAGS["reranker"], FLAGS["iris"]):
    err = _refused(capsys, "eval", "--data", str(three), "--quiet", *flags, str(earlier))
    assert (f"{earlier} holds no rmmjax.json: written by an earlier rmmjax (format 0; this one "
            "reads format 2)") in err
  # An unfinished learner=both run: its first stage holds the only manifest yet.
  stopped = tmp_path / "stopped"
  (stopped / "query_encoder").mkdir(parents=True)
  (stopped / "query_encoder" / "config.json").write_text("{}")
  assert "run the same train command again" in _refused(
      capsys, "eval", "--data", str(three), "--quiet", "--reranker", str(stopped))


def test_the_manifest_names_the_kind(tmp_path):
  for learner, kind in (("cross", "reranker export"), ("query_encoder,cross", "both export"),
                        ("query_encoder", "query encoder export"), ("iris", "iris export")):
    assert model_kind(_export(tmp_path / learner, format=2, learner=learner)) == kind
  (tmp_path / "run").mkdir()
  (tmp_path / "run" / "rmmjax.json").write_text(json.dumps(
      {"format": 2, "kind": "train", "learner": "query_encoder", "stages": ["encoder_tuning"]}))
  assert model_kind(tmp_path / "run") == "query encoder"
  (tmp_path / "empty").mkdir()
  assert model_kind(tmp_path / "empty") == "empty"
  (tmp_path / "x.safetensors").write_bytes(b"")
  assert model_kind(tmp_path / "x.safetensors") == "reranker file"
