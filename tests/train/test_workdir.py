"""Workdirs: one kind of run each, refused before anything is written when they cannot be
continued, and resumed or extended to exactly the outputs (metrics.jsonl, summary.json,
TensorBoard, checkpoints) of an uninterrupted run."""

import contextlib
import json
import os
import re
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from tensorboardX.proto import event_pb2

from rmmjax import core
from rmmjax.cli import main
from rmmjax.config import Config
from rmmjax.io import metrics_log
from rmmjax.io.checkpoint import Checkpointer
from rmmjax.learners.registry import with_model
from rmmjax.io.workdir import (LOCK_FILE, atomic_write_text, held, read_config, replace_dir,
                               take_lock)
from rmmjax.train.sweep import chunks

pytestmark = pytest.mark.slow

TINY = ["dim=16", "num_users=8", "bank_size=32", "min_bank=12", "eval_sessions=16", "log_every=5",
        "checkpoint_every=15"]


def _train(wd, steps, *extra, quiet=True):
  sets = [arg for item in (*TINY, f"steps={steps}", *extra) for arg in ("--set", item)]
  return main(["train", "--workdir", str(wd), *(["--quiet"] if quiet else []), *sets])


def _sweep(wd, *grid, steps=20):
  sets = [arg for item in TINY for arg in ("--set", item)]
  return main(["sweep", "--workdir", str(wd), "--quiet", *(a for g in grid for a in ("--grid", g)),
               "--steps", str(steps), *sets])


def _events(logdir):
  """(tag, step, value) of every summary under logdir, in the order TensorBoard reads them."""
  found = []
  for path in sorted(logdir.rglob("events.out.tfevents.*")):
    data, pos = path.read_bytes(), 0
    while pos < len(data):
      (length,) = struct.unpack("<Q", data[pos:pos + 8])
      event = event_pb2.Event.FromString(data[pos + 12:pos + 12 + length])
      pos += 12 + length + 4
      for value in event.summary.value:
        kind = value.WhichOneof("value")
        shown = value.simple_value if kind == "simple_value" else bytes(value.tensor.string_val[0])
        found.append((str(path.parent.relative_to(logdir)), value.tag, event.step, shown))
  return found


def _snapshot(wd):
  """Every path under wd with its bytes and modification time: to check nothing was touched
  (but the lock file, which names the last process that held the workdir)."""
  return {str(p.relative_to(wd)): (p.read_bytes(), p.stat().st_mtime_ns) if p.is_file() else None
          for p in sorted(wd.rglob("*")) if p.name != ".lock"}


def _outputs(wd):
  return {"metrics": (wd / "metrics.jsonl").read_text(),
          "summary": json.loads((wd / "summary.json").read_text()),
          "events": _events(wd / "tb"),
          "checkpoints": sorted(p.name for p in (wd / "checkpoints").iterdir())}


def _garble_checkpoint(wd, step):
  """Overwrites the array data Orbax wrote for `step` with noise of the same sizes."""
  rng = np.random.default_rng(step)
  files = [p for p in (wd / "checkpoints" / str(step)).rglob("*")
           if p.is_file() and p.parent.name == "d"]
  assert files
  for path in files:
    path.write_bytes(rng.bytes(path.stat().st_size))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """An uninterrupted run of 60 steps (checkpoints every 15, rows every 5)."""
  wd = tmp_path_factory.mktemp("reference") / "run"
  assert _train(wd, 60) == 0
  return wd, _outputs(wd)


@pytest.fixture
def copy(reference, tmp_path):
  wd = tmp_path / "run"
  shutil.copytree(reference[0], wd)
  return wd


def test_fewer_steps_than_done_are_refused(copy, capsys):
  before = _snapshot(copy)
  assert _train(copy, 30) == 2
  err = capsys.readouterr().err
  assert f"{copy} has already trained 60 steps and steps=30 asks for fewer" in err
  assert _snapshot(copy) == before


def test_a_workdir_holds_one_kind_of_run(copy, tmp_path, capsys):
  before = _snapshot(copy)
  assert _sweep(copy, "tau=0.1,1.0") == 2
  assert f"{copy} holds a training run" in capsys.readouterr().err
  assert _snapshot(copy) == before

  sweep_wd = tmp_path / "sweep"
  assert _sweep(sweep_wd, "tau=0.1,1.0") == 0
  assert json.loads((sweep_wd / "rmmjax.json").read_text())["kind"] == "sweep"
  events = _events(sweep_wd / "tb")
  before = _snapshot(sweep_wd)
  assert _train(sweep_wd, 60) == 2
  assert f"{sweep_wd} holds a sweep, not a training run" in capsys.readouterr().err
  with pytest.raises(ValueError, match="holds a sweep, not a training run"):
    read_config(sweep_wd)
  assert _sweep(sweep_wd, "tau=0.1,0.5") == 2
  err = capsys.readouterr().err
  assert "holds a sweep of another grid" in err and "[0.1, 1.0]" in err
  assert _sweep(sweep_wd, "tau=0.1,1.0", steps=30) == 2
  assert "steps: 20 there, 30 now" in capsys.readouterr().err
  assert _snapshot(sweep_wd) == before
  # The same sweep again overwrites its own outputs, TensorBoard included (no second copy).
  assert _sweep(sweep_wd, "tau=0.1,1.0") == 0
  assert _events(sweep_wd / "tb") == events
  assert sorted(p.name for p in (sweep_wd / "tb").iterdir()) == ["tau=0.1", "tau=1.0"]
  assert isinstance(read_config(copy), Config)


def test_cut_short_last_metrics_line_is_dropped_and_a_damaged_one_refused(copy, reference,
                                                                           capsys):
  with open(copy / "metrics.jsonl", "a") as f:
    f.write('{"step": 65, "rew')  # what a kill in the middle of an append leaves
  assert _train(copy, 60) == 0
  out = capsys.readouterr()
  assert "resuming" not in out.err  # --quiet
  # The run says how long it took, a resumed one the part it ran.
  assert re.search(r"^trained in \d+ s \(this command, .* a resumed run: the part it ran\)$",
                   out.out, re.M), out.out
  assert _outputs(copy) == reference[1]

  lines = (copy / "metrics.jsonl").read_text().splitlines(keepends=True)
  lines[2] = lines[2][:20] + "\n"
  (copy / "metrics.jsonl").write_text("".join(lines))
  before = _snapshot(copy)
  assert _train(copy, 60) == 2
  assert f"{copy / 'metrics.jsonl'}, line 3: not a metrics row" in capsys.readouterr().err
  assert _snapshot(copy) == before


def test_read_rows_drops_only_a_cut_short_last_line(tmp_path):
  path = tmp_path / "metrics.jsonl"
  path.write_bytes(b'{"step": 5, "reward": 1.0}\n{"step": 10, "reward": 2.0}\n\xff\xfe{"st')
  assert [r["step"] for r in metrics_log.read_rows(path)] == [5, 10]
  path.write_bytes(b'{"step": 5, "reward": 1.0}\n[1, 2]\n{"step": 15, "reward": 2.0}\n')
  with pytest.raises(ValueError, match=r"metrics.jsonl, line 2: not a metrics row"):
    metrics_log.read_rows(path)


def test_unreadable_newest_checkpoint_falls_back_to_the_one_before(copy, reference, capsys):
  _garble_checkpoint(copy, 60)
  assert _train(copy, 60) == 0
  err = capsys.readouterr().err
  assert f"skipping unreadable checkpoint {copy / 'checkpoints' / '60'}" in err
  assert "resuming from step 45" in err
  assert _outputs(copy) == reference[1]

  _garble_checkpoint(copy, 45)
  _garble_checkpoint(copy, 60)
  before = _snapshot(copy)
  assert _train(copy, 60) == 2
  err = capsys.readouterr().err
  assert f"no checkpoint in {copy / 'checkpoints'} reads back (step 60: " in err
  assert "step 45: " in err and "Traceback" not in err
  assert _snapshot(copy) == before


def test_resume_after_a_kill_rebuilds_tensorboard_exactly(copy, reference, capsys):
  # Killed after logging steps 46-60 and before checkpointing step 60, in the middle of
  # appending a TensorBoard event.
  shutil.rmtree(copy / "checkpoints" / "60")
  with open(sorted((copy / "tb").iterdir())[-1], "ab") as f:
    f.write(b"\x20\x00\x00\x00\x00\x00\x00\x00\x01\x02")
  assert _train(copy, 60, quiet=False) == 0
  outputs = _outputs(copy)
  steps = [step for _, tag, step, _ in outputs["events"] if tag == "train/reward"]
  assert steps == list(range(5, 65, 5))
  assert outputs == reference[1]
  assert f"resuming {copy} from step 45 of 60" in capsys.readouterr().err


def test_extended_run_equals_an_uninterrupted_one(tmp_path, reference, capsys):
  wd = tmp_path / "run"
  assert _train(wd, 42) == 2
  assert "steps=42 is not a multiple of log_every=5" in capsys.readouterr().err
  assert not wd.exists()
  assert _train(wd, 40) == 0
  assert _train(wd, 60) == 0
  assert _outputs(wd) == reference[1]


def test_reading_checkpoints_creates_nothing(tmp_path, capsys):
  wd = tmp_path / "run"
  atomic_write_text(wd / "config.json", Config().to_json())
  for read_only in (True, False):  # a writable one creates the folder only when it saves
    reader = Checkpointer(wd / "checkpoints", read_only=read_only)
    assert reader.all_steps() == []
    template = core.init_state(with_model(Config().core_spec()), Config().hparams())
    assert reader.restore_latest(template) == (0, None, [])
    reader.close()
  assert main(["export", "--workdir", str(wd), "--out", str(tmp_path / "x.safetensors")]) == 2
  assert "checkpoint" in capsys.readouterr().err
  assert sorted(p.name for p in wd.iterdir()) == ["config.json"]


def test_written_files_follow_the_umask(tmp_path, reference):
  mask = os.umask(0o022)
  os.umask(mask)
  for name in ("config.json", "rmmjax.json", "summary.json", "metrics.jsonl"):
    assert (reference[0] / name).stat().st_mode & 0o777 == 0o666 & ~mask, name
  try:
    for umask in (0o022, 0o077, 0o002):
      os.umask(umask)
      path = tmp_path / f"file{umask}.txt"
      atomic_write_text(path, "x")
      assert path.stat().st_mode & 0o777 == 0o666 & ~umask
      with replace_dir(tmp_path / f"dir{umask}") as tmp:
        (tmp / "a").write_text("a")
      assert (tmp_path / f"dir{umask}").stat().st_mode & 0o777 == 0o777 & ~umask
  finally:
    os.umask(mask)


def test_sweep_refuses_a_repeated_grid_value(tmp_path, capsys):
  assert _sweep(tmp_path / "s", "tau=0.1,0.10") == 2
  assert "--grid 'tau=0.1,0.10': tau=0.1 is given more than once" in capsys.readouterr().err
  assert not (tmp_path / "s").exists()


def test_sweep_progress_moves_as_chunks_finish(monkeypatch):
  log = []

  class Bar:
    def __init__(self, *args, **kwargs):
      pass

    def __enter__(self):
      return self

    def __exit__(self, *exc):
      return False

    def __iter__(self):  # what a bar over pending results would do
      raise AssertionError("the bar must advance chunk by chunk")

    def update(self, n=1):
      log.append("done")

  def run_chunk(hp, world):
    log.append("dispatch")
    return {"tau": np.asarray(hp.tau)}

  monkeypatch.setattr(chunks, "tqdm", Bar)
  hparams = core.stack_hparams([core.HParams.create(tau=t) for t in (0.1, 0.2, 0.3, 0.4, 0.5)])
  out = chunks.run_chunks(run_chunk, hparams, None, chunk_size=2, progress=True)
  np.testing.assert_allclose(out["tau"], [0.1, 0.2, 0.3, 0.4, 0.5])
  assert log == ["dispatch", "dispatch", "done", "dispatch", "done", "done"]


def test_ctrl_c_says_how_to_resume(monkeypatch, capsys, tmp_path):
  import rmmjax.cli.training as training
  from rmmjax.cli import main

  def interrupted(*args, **kwargs):
    raise KeyboardInterrupt

  monkeypatch.setattr(training, "train", interrupted)
  assert main(["train", "--workdir", str(tmp_path / "run"), "--quiet"]) == 130
  err = capsys.readouterr().err
  assert "interrupted; rerun the same command to resume" in err and "Traceback" not in err


def test_a_second_process_on_a_workdir_is_refused_naming_the_holder(tmp_path, reference, capsys):
  import subprocess  # noqa: PLC0415
  import sys  # noqa: PLC0415
  import time  # noqa: PLC0415
  wd = tmp_path / "busy"
  sets = [arg for item in (*TINY, "steps=30000", "checkpoint_every=15000", "log_every=15000")
          for arg in ("--set", item)]
  # The first holder runs in its own process; the second, here, is refused while it runs.
  first = subprocess.Popen([sys.executable, "-m", "rmmjax.cli", "train", "--quiet", "--workdir",
                            str(wd), *sets], stderr=subprocess.PIPE, text=True)
  try:
    deadline = time.time() + 120
    while not ((wd / ".lock").exists() and (wd / ".lock").read_text()):
      assert first.poll() is None and time.time() < deadline, first.stderr.read()
      time.sleep(0.05)
    capsys.readouterr()
    assert main(["train", "--quiet", "--workdir", str(wd), *sets]) == 2
    err = capsys.readouterr().err
    assert f"in use by rmmjax train (pid {first.pid} on" in err and len(err.splitlines()) == 1
    assert main(["sweep", "--quiet", "--workdir", str(wd), "--grid", "tau=0.1,0.5",
                 *sets]) == 2
    assert f"pid {first.pid}" in capsys.readouterr().err
    # Its checkpoints are written and pruned as it runs: reading it is refused, naming it.
    assert main(["export", "--workdir", str(wd), "--out", str(tmp_path / "x.safetensors")]) == 2
    err = capsys.readouterr().err
    assert f"--workdir {wd} is being trained by rmmjax train (pid {first.pid}" in err
    assert len(err.splitlines()) == 1 and not (tmp_path / "x.safetensors").exists()
    # The lock is the folder's own: a lock file deleted under the holder lets no one in.
    (wd / ".lock").unlink()
    assert main(["train", "--quiet", "--workdir", str(wd), *sets]) == 2
    assert "in use by another process" in capsys.readouterr().err
  finally:
    assert first.wait(timeout=300) == 0, first.stderr.read()
  # The holder's outputs are a lone run's.
  alone = tmp_path / "alone"
  assert main(["train", "--quiet", "--workdir", str(alone), *sets]) == 0
  for name in ("metrics.jsonl", "summary.json"):
    assert (wd / name).read_text() == (alone / name).read_text()
  # Released on exit: the same command resumes (nothing left to do) without a word of refusal.
  assert main(["train", "--quiet", "--workdir", str(wd), *sets]) == 0


def test_a_workdir_linked_to_nowhere_is_refused_by_name(tmp_path, capsys):
  link = tmp_path / "link"
  link.symlink_to(tmp_path / "nowhere")
  assert _train(link, 10) == 2
  err = capsys.readouterr().err
  assert "nowhere, which does not exist" in err and "Traceback" not in err
  assert not (tmp_path / "nowhere").exists()


def _refused_after_the_lock(monkeypatch):
  """A check after the workdir is held refuses the run (what a damaged log or another config
  does), so the lock's own cleanup is what these tests see."""
  from rmmjax.train import loop  # noqa: PLC0415
  held = []

  def refuse(workdir, cfg):
    held.append((workdir / ".lock").exists())
    raise ValueError("refused after the lock")

  monkeypatch.setattr(loop, "check_resumable", refuse)
  return held


def test_a_refused_run_leaves_no_workdir_behind(tmp_path, capsys, monkeypatch):
  held = _refused_after_the_lock(monkeypatch)
  wd = tmp_path / "never"
  assert _train(wd, 10) == 2
  assert held == [True] and not wd.exists()


def test_a_refusal_removes_every_folder_it_made_and_leaves_no_lock(tmp_path, capsys,
                                                                  monkeypatch):
  held = _refused_after_the_lock(monkeypatch)
  deep = tmp_path / "new" / "deeper" / "run"
  assert _train(deep, 10) == 2
  assert not (tmp_path / "new").exists()
  empty = tmp_path / "empty"
  empty.mkdir()
  assert _train(empty, 10) == 2
  assert list(empty.iterdir()) == [] and held == [True, True]


@pytest.mark.parametrize("value, message", [
    ("seed=-1", "seed=-1: expected an integer from 0 to 2,147,483,647"),
    ("seed=4294967296", "seed=4,294,967,296: expected an integer from 0"),
    ("steps=10000000000", "steps=10,000,000,000: expected an integer from 0 to 10,000,000"),
])
def test_values_far_outside_a_working_range_are_refused(tmp_path, capsys, value, message):
  sets = [arg for item in (*TINY, value) for arg in ("--set", item)]
  assert main(["train", "--workdir", str(tmp_path / "run"), "--quiet", *sets]) == 2
  assert message in capsys.readouterr().err
  assert not (tmp_path / "run").exists()
  assert main(["sweep", "--workdir", str(tmp_path / "sweep"), "--quiet", "--seeds",
               "100000000", *[a for i in TINY for a in ("--set", i)]]) == 2
  assert "--seeds 100000000: expected 1 to 1,000" in capsys.readouterr().err


def test_a_folder_removed_and_made_again_between_open_and_lock_is_not_held_twice(
    tmp_path, monkeypatch):
  """Three processes played by hand (flock locks of separate opens exclude each other within
  one process too): A holds a new workdir; B opens it to lock it; before B locks, A's run is
  refused, so A removes the folder it made, and C makes and locks it again. B's lock on the
  removed folder must not count: B is refused, naming C."""
  import fcntl  # noqa: PLC0415

  from rmmjax.io import workdir  # noqa: PLC0415
  wd = tmp_path / "made" / "run"
  a_held = workdir.held(wd, "train")
  a_held.__enter__()
  real_flock, c_lock = fcntl.flock, []

  def interleaved(fd, operation):
    monkeypatch.setattr(workdir.fcntl, "flock", real_flock)  # (once: B's first lock)
    with contextlib.suppress(ValueError):
      a_held.__exit__(ValueError, ValueError("refused"), None)  # A leaves nothing behind
    assert not wd.exists()
    c_lock.append(workdir.take_lock(wd, "C's words"))
    return real_flock(fd, operation)

  monkeypatch.setattr(workdir.fcntl, "flock", interleaved)
  lock, words = workdir.take_lock(wd, "B's words")
  assert c_lock[0][0] is not None and (lock, words) == (None, "C's words")
  c_lock[0][0].close()


def test_a_folder_removed_between_made_and_opened_is_made_again(tmp_path, monkeypatch):
  from rmmjax.io import workdir  # noqa: PLC0415
  wd = tmp_path / "run"
  real_open, opened = os.open, []

  def removed_first(path, flags, *args):
    if not opened and Path(path) == wd:
      opened.append(wd.rmdir())  # another process's cleanup, just after the mkdir
    return real_open(path, flags, *args)

  monkeypatch.setattr(workdir.os, "open", removed_first)
  lock, words = workdir.take_lock(wd, "mine")
  assert lock is not None and words == "mine" and wd.is_dir() and opened
  lock.close()


def test_the_export_of_an_unfinished_run_says_so(tmp_path, capsys):
  wd = tmp_path / "run"
  assert _train(wd, 30) == 0
  shutil.rmtree(wd / "checkpoints" / "30")  # as if killed between its checkpoints
  capsys.readouterr()
  assert main(["export", "--workdir", str(wd), "--out", str(tmp_path / "x.safetensors")]) == 0
  assert (f"NOTE: {wd} has trained 15 of its 30 steps (interrupted): the export holds step 15"
          in capsys.readouterr().out)


def test_a_run_whose_workdir_is_removed_under_it_stops_rather_than_writing_into_the_new_one(
    tmp_path, capsys):
  import subprocess  # noqa: PLC0415
  import sys  # noqa: PLC0415
  import time  # noqa: PLC0415
  wd = tmp_path / "run"
  sets = [arg for item in (*TINY, "steps=3000000", "checkpoint_every=30000")
          for arg in ("--set", item)]
  first = subprocess.Popen([sys.executable, "-m", "rmmjax.cli", "train", "--quiet", "--workdir",
                            str(wd), *sets], stderr=subprocess.PIPE, text=True)
  try:
    deadline = time.time() + 120
    while not (wd / "metrics.jsonl").exists():
      assert first.poll() is None and time.time() < deadline, first.stderr.read()
      time.sleep(0.05)
    # Moved away in one step, then removed: an rmtree of the path itself races the run's writes
    # into it ("directory not empty").
    shutil.rmtree(wd.rename(tmp_path / "removed"), ignore_errors=True)
    assert _train(wd, 30) == 0  # the folder made again, and held, by another run
    _, err = first.communicate(timeout=300)
  finally:
    first.kill()
  assert first.returncode == 2, err[-2000:]
  assert f"{wd} was removed or replaced while this run held it: stopped" in err
  alone = tmp_path / "alone"
  assert _train(alone, 30) == 0
  for name in ("metrics.jsonl", "summary.json"):
    assert (wd / name).read_text() == (alone / name).read_text()


def test_a_run_ending_after_its_folder_was_removed_leaves_the_one_made_again_alone(tmp_path):
  """A refused or stopped run cleans up the folders it made only while the folder it locked is
  still the one at the path: one removed under it and made again is another process's."""
  wd = tmp_path / "made" / "run"
  with held(wd, "train"):
    shutil.rmtree(tmp_path / "made")
    other, _ = take_lock(wd, "another run")  # (the path's new folder, made and locked)
    assert other is not None
  assert (wd / LOCK_FILE).is_file()
  other.check()  # still the folder at the path
  other.close()


def test_a_workdir_says_what_it_holds_and_one_without_its_manifest_is_refused(tmp_path, capsys):
  wd = tmp_path / "run"
  assert _train(wd, 30) == 0
  manifest = json.loads((wd / "rmmjax.json").read_text())
  assert manifest == {"format": 2, "kind": "train", "learner": "linear",
                      "stages": ["reranker"]}
  out = tmp_path / "x.safetensors"
  # An earlier rmmjax's workdir (run.json, no manifest): refused in one line, nothing guessed.
  (wd / "rmmjax.json").rename(wd / "run.json")
  capsys.readouterr()
  for argv in (["train", "--workdir", str(wd), "--quiet", *[a for item in (*TINY, "steps=30")
                                                           for a in ("--set", item)]],
               ["export", "--workdir", str(wd), "--out", str(out)]):
    assert main(argv) == 2
    assert "no rmmjax.json: written by an earlier rmmjax (format 0; this one reads format 2)" in (
        capsys.readouterr().err)
  (wd / "rmmjax.json").write_text(json.dumps(manifest | {"format": 1}))
  assert main(["export", "--workdir", str(wd), "--out", str(out)]) == 2
  assert "was written in rmmjax's format 1; this rmmjax reads format 2" in capsys.readouterr().err
  assert not out.exists()
