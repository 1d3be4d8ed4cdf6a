"""The command line end to end: outputs, bad input, kill-and-resume, sweeps, export."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from rmmjax import core
from rmmjax.cli import main

pytestmark = pytest.mark.slow

TINY = ["dim=16", "num_users=8", "bank_size=32", "min_bank=12", "eval_sessions=16", "log_every=5"]


def _sets(*items):
  return [arg for item in (*TINY, *items) for arg in ("--set", item)]


def test_train_writes_every_output(tmp_path, capsys):
  wd = tmp_path / "run"
  assert main(["train", "--workdir", str(wd), "--quiet", *_sets("steps=40",
                                                                "checkpoint_every=20")]) == 0
  summary = json.loads((wd / "summary.json").read_text())
  for key in ("recall_at_m_base", "recall_at_m_final", "reward_first", "reward_last", "steps"):
    assert key in summary
  assert summary["steps"] == 40
  rows = [json.loads(line) for line in (wd / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows] == list(range(5, 45, 5))
  assert {"reward", "citation_rate", "recall_at_m", "loss", "grad_norm", "entropy"} <= set(rows[0])
  assert (wd / "curves.png").stat().st_size > 10_000
  assert any((wd / "tb").iterdir())
  assert sorted(p.name for p in (wd / "checkpoints").iterdir() if p.name.isdigit()) == ["20", "40"]
  out = capsys.readouterr().out
  assert "recall@M" in out and "summary.json" in out


@pytest.mark.parametrize("override,message", [
    ("m=30", "m=30 > k=20"),
    ("tau=0", "reranker.tau=0: expected a value in [0.001, 100]"),
    ("tau=1e-9", "reranker.tau=1e-09: expected a value in [0.001, 100]"),
    ("lr=1", "reranker.lr=1: expected a value in (0, 0.1]"),
    ("tua=0.5", "unknown config key 'tua' (did you mean 'tau'?)"),
    ("tau=nan", "expected a finite number"),
    ("nonsense=1", "unknown config key 'nonsense'"),
    ("learner=cubic", "learner='cubic': expected one of linear, mlp, cross"),
    ("learner=query_encoder", "learner='query_encoder': these keys configure the replay"),
    ("k=40", "k=40 > bank_size=32"),
])
def test_bad_config_is_refused_before_anything_is_written(tmp_path, capsys, override, message):
  wd = tmp_path / "run"
  assert main(["train", "--workdir", str(wd), "--quiet", *_sets(override)]) == 2
  assert message in capsys.readouterr().err
  assert not wd.exists()


def test_workdir_of_another_config_is_refused(tmp_path, capsys):
  wd = tmp_path / "run"
  assert main(["train", "--workdir", str(wd), "--quiet", *_sets("steps=20",
                                                                "checkpoint_every=20")]) == 0
  before = sorted(str(p) for p in wd.rglob("*"))
  assert main(["train", "--workdir", str(wd), "--quiet", *_sets("steps=20", "checkpoint_every=20",
                                                                "tau=0.9")]) == 2
  err = capsys.readouterr().err
  assert "holds a run of another config" in err and "tau: 0.5 there, 0.9 now" in err
  assert sorted(str(p) for p in wd.rglob("*")) == before


def test_killed_run_resumes_to_the_same_final_metrics(tmp_path):
  args = _sets("steps=3000", "checkpoint_every=500")
  reference = tmp_path / "reference"
  assert main(["train", "--workdir", str(reference), "--quiet", *args]) == 0

  killed = tmp_path / "killed"
  cmd = [sys.executable, "-m", "rmmjax.cli", "train", "--workdir", str(killed), "--quiet", *args]
  proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  deadline = time.time() + 240
  while not (killed / "checkpoints" / "1000").exists():
    assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
    assert time.time() < deadline
    time.sleep(0.05)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert not (killed / "summary.json").exists()
  resumed = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
  assert resumed.returncode == 0, resumed.stderr[-2000:]
  assert json.loads((killed / "summary.json").read_text()) == json.loads(
      (reference / "summary.json").read_text())
  assert (killed / "metrics.jsonl").read_text() == (reference / "metrics.jsonl").read_text()


def test_sweep_writes_one_record_per_run(tmp_path, capsys):
  wd = tmp_path / "sweep"
  assert main(["sweep", "--workdir", str(wd), "--quiet", "--grid", "tau=0.1,1.0",
               "--grid", "baseline=0,0.5", "--seeds", "2", "--steps", "30", *_sets()]) == 0
  result = json.loads((wd / "sweep.json").read_text())
  assert len(result["runs"]) == 8
  keys = {"tau", "baseline", "seed", "recall_at_m_base", "recall_at_m_final", "reward_first",
          "reward_last"}
  assert all(keys <= set(r) for r in result["runs"])
  assert {(r["tau"], r["baseline"], r["seed"]) for r in result["runs"]} == {
      (t, b, s) for t in (0.1, 1.0) for b in (0.0, 0.5) for s in (0, 1)}
  assert len(list((wd / "tb").iterdir())) == 4
  assert (wd / "curves.png").exists()
  assert "tau=0.1,baseline=0.0" in capsys.readouterr().out


def test_sweep_refuses_a_static_key(tmp_path, capsys):
  assert main(["sweep", "--workdir", str(tmp_path / "s"), "--grid", "k=10,20", *_sets()]) == 2
  assert "changes the compiled program" in capsys.readouterr().err


_NUMPY_ONLY = """
import sys, json, numpy as np
sys.modules["jax"] = None  # any import of JAX now fails
from rmmjax.learners.embedding.serving import NumpyReranker
data = np.load(sys.argv[2])
scorer = NumpyReranker.load(sys.argv[1])
scores = np.stack([scorer.score(q, m) for q, m in zip(data["q"], data["m"])])
np.save(sys.argv[3], scores)
print(json.dumps(scorer.top_m(data["q"][0], data["m"][0]).tolist()))
"""


@pytest.mark.parametrize("variant", ["linear", "mlp"])
def test_export_round_trip_without_jax(tmp_path, variant):
  wd = tmp_path / "run"
  assert main(["train", "--workdir", str(wd), "--quiet",
               *_sets("steps=200", "checkpoint_every=100", f"learner={variant}", "hidden=8",
                      "lr=0.01")]) == 0
  out = tmp_path / "export" / "reranker.safetensors"
  assert main(["export", "--workdir", str(wd), "--out", str(out)]) == 0
  meta = json.loads(out.with_suffix(".json").read_text())
  assert meta["variant"] == variant and meta["dim"] == 16 and meta["hparams"]["tau"] == 0.5

  from rmmjax.config import Config
  from rmmjax.io.trained import load_trained_params
  from rmmjax.io.workdir import read_config
  from rmmjax.learners.embedding.model import EMBEDDING, batch_scores
  spec = dataclasses.replace(read_config(wd).core_spec(), model=EMBEDDING)
  params, cfg, _ = load_trained_params(wd, spec)
  assert isinstance(cfg, Config)
  world = core.make_world(cfg.sim_spec(), spec.dim)
  batch = core.sample_batch(world, jax.random.PRNGKey(7), cfg.sim_spec(), spec, sessions=8)
  want = np.asarray(batch_scores(params, batch.q_BxD, batch.mem_BxKxD, spec))
  assert np.abs(want - np.einsum("bkd,bd->bk", batch.mem_BxKxD, batch.q_BxD)).max() > 1e-3
  np.savez(tmp_path / "data.npz", q=np.asarray(batch.q_BxD), m=np.asarray(batch.mem_BxKxD))
  result = subprocess.run([sys.executable, "-c", _NUMPY_ONLY, str(out), str(tmp_path / "data.npz"),
                           str(tmp_path / "scores.npy")], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ))
  assert result.returncode == 0, result.stderr[-2000:]
  np.testing.assert_allclose(np.load(tmp_path / "scores.npy"), want, atol=1e-5, rtol=1e-5)
  assert json.loads(result.stdout) == list(np.argsort(-want[0], kind="stable")[:cfg.m])


def test_export_refuses_a_workdir_without_checkpoints(tmp_path, capsys):
  assert main(["export", "--workdir", str(tmp_path), "--out", str(tmp_path / "x.safetensors")]) == 2
  assert "config.json" in capsys.readouterr().err


def test_numpy_scorer_refuses_bad_embeddings(tmp_path):
  from rmmjax.learners.embedding.serving import NumpyReranker
  scorer = NumpyReranker({"wq": np.zeros((4, 4)), "wm": np.zeros((4, 4))},
                         {"variant": "linear", "dim": 4, "m": 2})
  with pytest.raises(ValueError,
                     match=r"memories holds 3 NaN or infinite values \(first at index \(0, 3\)\)"):
    scorer.score(np.ones(4), np.array([[1, 2, 3, np.nan]] * 3))
  with pytest.raises(ValueError, match=r"query has shape \(3,\); expected \(D,\) with D=4"):
    scorer.score(np.ones(3), np.ones((2, 4)))


def test_bench_search_runs_and_agrees_with_its_reference(tmp_path):
  out = tmp_path / "search.json"
  assert main(["bench", "search", "--quick", "--out", str(out)]) == 0
  result = json.loads(out.read_text())
  assert result["top_k_agreement"] == 1.0 and len(result["rows"]) == 2
  assert all(r["queries_per_s"] > 0 for r in result["rows"])


def test_the_cross_bench_counts_flops_as_the_textbook_formula_does():
  """bench cross's FLOP count (XLA's, of the compiled program) against 2 m k n for a matmul and
  m n more for a bias added after it; the matmul rate it divides by is a positive rate."""
  from rmmjax.bench.cross import compiled_flops, matmul_rate
  a, b, c = (np.ones(s, np.float32) for s in [(64, 32), (32, 16), (1, 16)])
  assert compiled_flops(jax.jit(lambda x, y: x @ y), a, b) == 2 * 64 * 32 * 16
  assert compiled_flops(jax.jit(lambda x, y, z: x @ y + z), a, b, c) == 2 * 64 * 32 * 16 + 64 * 16
  assert matmul_rate(repeats=1) > 0


def test_a_workdir_where_nothing_can_be_created_is_refused_by_name(capsys):
  proc = Path("/proc/self")
  if not proc.is_dir():
    pytest.skip("no /proc here")
  assert main(["train", "--config", "latent", "--set", "steps=10", "--workdir",
               str(proc / "run")]) == 2
  err = capsys.readouterr().err
  assert "--workdir /proc/self/run: /proc/self is not writable" in err


# Python's own SIGINT handler, as a terminal's user has it (a suite started in a shell's
# background inherits SIGINT ignored: a Ctrl-C before this line would be lost), then a line on
# stderr from which a test times its Ctrl-C.
_WITH_CTRL_C = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
                "print('started', file=sys.stderr, flush=True); "
                "from rmmjax.cli.main import command; command()")


_INTERRUPT_IN_A_DEL = """
import os, signal, time
from rmmjax.cli import signals
signal.signal(signal.SIGINT, signal.default_int_handler)
signals.install()
class Finalized:
  def __del__(self):  # an exception raised here can only be reported, not passed on
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.5)
try:
  Finalized()
  time.sleep(10)
  print("ran on")
except KeyboardInterrupt:
  print("stopped")
"""


def test_an_interrupt_landing_where_it_can_only_be_reported_is_sent_again():
  out = subprocess.run([sys.executable, "-c", _INTERRUPT_IN_A_DEL], capture_output=True,
                       text=True, timeout=60)
  assert out.stdout.strip() == "stopped", out.stdout + out.stderr
  assert "Exception ignored" not in out.stderr


@pytest.mark.parametrize("delay", [0.3, 0.8, 1.5, 3.0])
def test_ctrl_c_stops_a_run_at_any_moment_of_its_start(tmp_path, delay):
  """Ctrl-C landing in a garbage-collector callback of jaxlib's used to be printed as ignored
  (the run went on to its end), and one landing in an import failed it with ImportError."""
  proc = subprocess.Popen([sys.executable, "-c", _WITH_CTRL_C, "train", "--workdir",
                           str(tmp_path / "run"), "--quiet", *_sets("steps=20000")],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert proc.stderr.readline() == "started\n"  # (the interpreter's own start is not rmmjax's)
  time.sleep(delay)
  proc.send_signal(signal.SIGINT)
  _, err = proc.communicate(timeout=120)
  assert proc.returncode == 130, err[-2000:]
  assert "interrupted" in err and "Exception ignored" not in err and "Traceback" not in err
  assert not (tmp_path / "run" / "summary.json").exists()


@pytest.mark.parametrize("delay", [2.0, 3.0, 4.5, 6.0])
def test_sigterm_stops_a_run_saying_so_and_how_to_resume(tmp_path, delay):
  """(The process's teardown used to meet computations still in flight: a segmentation fault,
  exit 139, in about a quarter of the stops.)"""
  proc = subprocess.Popen([sys.executable, "-m", "rmmjax.cli", "train", "--workdir",
                           str(tmp_path / "run"), "--quiet", *_sets("steps=2000000")],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))
  time.sleep(delay)
  proc.terminate()
  _, err = proc.communicate(timeout=120)
  assert proc.returncode == 143, err[-2000:]  # 128 + SIGTERM, as the shell reports a kill
  assert "rmmjax train: terminated; rerun the same command to resume" in err, err[-2000:]
  assert "Traceback" not in err


def test_sigterm_ends_a_latent_sweep_without_waiting_for_its_chunk_in_flight(tmp_path):
  # (a chunk of 2,000,000 steps runs for minutes here; the sweep writes nothing before its end)
  proc = subprocess.Popen([sys.executable, "-m", "rmmjax.cli", "sweep", "--workdir",
                           str(tmp_path / "sweep"), "--quiet", "--grid", "lr=1e-3,1e-2",
                           *_sets("steps=2000000")],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))
  try:
    time.sleep(8.0)
    proc.terminate()
    _, err = proc.communicate(timeout=60)
  finally:
    proc.kill()
  assert proc.returncode == 143, err[-2000:]
  assert ("rmmjax sweep: terminated; nothing was written (the latent simulator's sweep writes "
          "at its end: a rerun starts over)") in err and "Traceback" not in err
  assert not (tmp_path / "sweep").exists()


def test_the_evaluation_hint_of_a_run_names_the_flag_its_model_takes():
  from rmmjax.cli.training import eval_hint
  from rmmjax.config import apply_overrides, get_config
  cfg = lambda *s: apply_overrides(get_config("locomo"), list(s))  # noqa: E731
  assert eval_hint(cfg("learner=iris", "units=lace"), "W").endswith(
      "--units lace --retriever hybrid --iris learned --iris-model W")
  assert eval_hint(cfg(), "W").endswith("--units turn --retriever hybrid --encoder W")
  assert eval_hint(cfg("learner=linear", "retriever=bm25"), "W").endswith(
      "--retriever bm25 --reranker W")
  assert eval_hint(cfg("learner=linear", "units=lace", "iris_evidence.preset=wide"), "W").endswith(
      "--units lace --iris wide --retriever hybrid --reranker W")
  assert eval_hint(cfg("learner=query_encoder,linear"), "W").endswith("--reranker W")
