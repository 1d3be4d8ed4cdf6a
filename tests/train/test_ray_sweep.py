"""`rmmjax sweep --config locomo --on ray`: every run a task of a real local Ray cluster (two
CPUs, shared by the module), on the synthetic conversations and the tiny BERT. The same
sweep.json as in one process, for the vmapped embedding reranker and the run-by-run cross
reranker with a worker SIGKILLed mid-run; runs at once on distinct cores; a run that fails for
its own reason, or reads another data file, is recorded once, not retried."""

import json
import os
import signal
import sys
import threading
import time

import pytest

from cli_args import sets as _sets
from rmmjax.cli import main

pytestmark = pytest.mark.usefixtures("tiny_encoder")

SMALL = ("dim=32", "learner=linear", "retriever=bm25", "k=10", "steps=12",
         "pretrain_epochs=2", "log_every=4")
CROSS = ("learner=cross", "dim=32", "k=5", "m=2", "batch=2", "steps=4",
         "log_every=2", "checkpoint_every=2", "max_length=48", "pretrain_candidates=4",
         "pretrain_epochs=1")


@pytest.fixture(scope="module")
def ray_cluster():
  ray = pytest.importorskip("ray")
  ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
  yield ray
  ray.shutdown()


def _sweep(three, wd, sets, *extra):
  return main(["sweep", "--config", "locomo", "--workdir", str(wd), "--quiet", "--folds", "2",
               "--seeds", "1", "--no-best", *extra, *_sets(f"data={three}", *sets)])


def _same(a, b):
  """sweep.json's content apart from how it was made (its command and folders)."""
  a, b = (json.loads((w / "sweep.json").read_text()) for w in (a, b))
  for result in (a, b):
    result.pop("made_by")
  assert a == b


def _records(wd):
  return {p.stem: json.loads(p.read_text()) for p in (wd / "ray").glob("*.json")}


def test_on_ray_without_ray_says_how_to_install_it(three, tmp_path, capsys, monkeypatch):
  monkeypatch.setitem(sys.modules, "ray", None)  # (import ray then fails)
  assert _sweep(three, tmp_path / "w", SMALL, "--on", "ray", "--grid", "lr=1e-4,1e-3") == 2
  assert 'pip install -e ".[ray]"' in capsys.readouterr().err
  assert _sweep(three, tmp_path / "w", SMALL, "--address", "auto") == 2
  assert "add --on ray" in capsys.readouterr().err
  assert _sweep(three, tmp_path / "w", SMALL, "--on", "ray", "--run-resources", "tpu=1") == 2
  assert "expected cpu=N and/or gpu=N" in capsys.readouterr().err


@pytest.mark.slow
def test_fold_programs_on_ray_give_the_same_sweep_at_once_on_two_cores(three, tmp_path,
                                                                        ray_cluster, capsys):
  grid = ("--grid", "lr=1e-4,1e-3")
  assert _sweep(three, tmp_path / "here", SMALL, *grid) == 0
  assert _sweep(three, tmp_path / "ray", SMALL, *grid, "--on", "ray", "--run-resources",
                "cpu=1") == 0
  out = capsys.readouterr().out
  assert "ray: 2 tasks of 1 CPU each" in out and "fold 1 (ran on " in out
  _same(tmp_path / "here", tmp_path / "ray")
  folds = _records(tmp_path / "ray")
  assert sorted(folds) == ["fold_0", "fold_1"]
  a, b = folds.values()
  # Two tasks of one CPU each on two: at once, each pinned to a core of its own.
  assert a["started"] < b["ended"] and b["started"] < a["ended"]
  assert len(a["cores"]) == len(b["cores"]) == 1 and a["cores"] != b["cores"]
  assert a["attempt"] == b["attempt"] == 1 and a["pid"] != b["pid"]
  # Run again: everything finished is reused, nothing is sent to the cluster.
  assert _sweep(three, tmp_path / "ray", SMALL, *grid, "--on", "ray") == 0
  assert "0 folds to run (2 done)" in capsys.readouterr().out


def test_a_failed_run_is_recorded_once_with_its_message(three, tmp_path, ray_cluster):
  from rmmjax.train.sweep.ray_backend import RayBackend  # noqa: PLC0415
  from rmmjax.io.record import file_sha256  # noqa: PLC0415
  backend = RayBackend(None, {"num_cpus": 1.0}, progress=False)
  backend.prepare(tmp_path, three, file_sha256(three))
  with pytest.raises(ValueError) as refused:
    backend.run([("bad", "the bad run", json.loads, ("{",)),
                 ("good", "the good run", os.getpid, ())], lambda line: None)
  assert "1 of 2 tasks failed" in str(refused.value)
  assert "the bad run: JSONDecodeError" in str(refused.value)
  records = _records(tmp_path)
  assert records["bad"]["attempt"] == 1 and "JSONDecodeError" in records["bad"]["failed"]
  assert "ended" in records["good"] and "failed" not in records["good"]
  # A node whose copy of the data differs is refused, not used.
  backend.prepare(tmp_path, three, "0" * 64)
  with pytest.raises(ValueError, match="is not the file this sweep recorded"):
    backend.run([("good", "the good run", os.getpid, ())], lambda line: None)
  assert _records(tmp_path)["good"]["attempt"] == 1


@pytest.mark.slow
def test_cross_runs_on_ray_with_a_worker_killed_give_the_same_sweep(three, tmp_path,
                                                                    ray_cluster):
  """A worker SIGKILLed after its run's first checkpoint: Ray retries the task, the run resumes
  from its checkpoint, and the sweep's table is the one-process sweep's."""
  grid = ("--grid", "cross.lr=1e-5")
  assert _sweep(three, tmp_path / "here", CROSS, *grid) == 0
  wd = tmp_path / "ray"
  killed = []

  def kill_after_a_checkpoint():
    record, checkpoints = wd / "ray" / "run_000_fold_0.json", wd / "runs" / "000" / "fold_0"
    deadline = time.time() + 300
    while time.time() < deadline:
      try:
        at = json.loads(record.read_text())
      except (OSError, ValueError):
        at = {}
      if at.get("pid") and any((checkpoints / "checkpoints").glob("[0-9]*")):
        os.kill(at["pid"], signal.SIGKILL)
        killed.append(at["pid"])
        return
      time.sleep(0.2)

  killer = threading.Thread(target=kill_after_a_checkpoint)
  killer.start()
  assert _sweep(three, wd, CROSS, *grid, "--on", "ray") == 0
  killer.join()
  assert killed
  record = _records(wd)["run_000_fold_0"]
  assert record["attempt"] == 2 and record["pid"] != killed[0]
  _same(tmp_path / "here", wd)
  assert (wd / "sweep.md").read_text() == (tmp_path / "here" / "sweep.md").read_text()
