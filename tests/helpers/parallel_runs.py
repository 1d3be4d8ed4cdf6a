"""Trains each training path twice in one process, on devices=1 and on every device, exports
both and writes the largest differences of their metrics and weights as JSON.

    XLA_FLAGS=--xla_force_host_platform_device_count=4 python tests/parallel_runs.py OUT DATA ROOT

(run by tests/test_distributed.py: a process's device count is fixed when JAX starts).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jax
import numpy as np
from safetensors.numpy import load_file

from rmmjax.cli import main

# The encoder is the default one: the tiny BERT of tests/helpers/tiny_bert.py when the test
# names it ($RMMJAX_ENCODER), whose dimension is 32.
SMALL = ["dim=32", "holdout=1", "steps=20", "checkpoint_every=10", "log_every=5"]
PATHS = {
    "latent": ["--config", "latent", "--set", "steps=100", "--set", "checkpoint_every=50"],
    "reranker": ["--config", "locomo", *[x for s in SMALL for x in ("--set", s)],
                 "--set", "learner=linear"],
    "query_encoder": ["--config", "locomo", *[x for s in SMALL for x in ("--set", s)],
                      "--set", "learner=query_encoder", "--set", "encoder_tuning.pretrain_epochs=1",
                      "--set", "k=10"],
    "reranker_in_iris": ["--config", "locomo", *[x for s in SMALL for x in ("--set", s)],
                         "--set", "learner=linear", "--set", "units=lace"],
    # learner=iris's online phase (the refinement encoder's REINFORCE) and the judge fitted
    # after it; its encoders' offline fits are compared on their own in _fits.
    "iris_online": ["--config", "locomo", *[x for s in SMALL for x in ("--set", s)],
                    "--set", "learner=iris", "--set", "units=lace", "--set",
                    "encoder_tuning.pretrain_epochs=0", "--set", "iris_models.k=16",
                    # Both conversations: the first alone holds two refinement examples.
                    "--set", "holdout=0", "--set", "validation=0"],
}


def _weights(out: Path) -> dict[str, np.ndarray]:
  files = [out] if out.suffix == ".safetensors" else sorted(out.rglob("*.safetensors"))
  return {f"{f.relative_to(out) if f != out else ''}:{k}": v
          for f in files for k, v in load_file(f).items()}


def _rows(workdir: Path) -> list[dict]:
  return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def _pretrain_diff(one: Path, every: Path) -> float | None:
  """The largest difference of the supervised pretraining losses (None: no pretraining)."""
  if not (one / "pretrain.json").exists():
    return None
  a, b = (json.loads((wd / "pretrain.json").read_text())["loss"] for wd in (one, every))
  assert len(a) == len(b)
  if not a:  # a fit of 0 epochs
    return None
  return max(abs(x - y) for x, y in zip(a, b))


def _fits() -> dict:
  """The learned IRIS models' offline fits (ranking encoder, judge) on synthetic examples, on
  one device and on every one: the largest differences of their losses and parameters."""
  from rmmjax import distributed  # noqa: PLC0415
  from rmmjax.encode.encoder import SentenceEncoder  # noqa: PLC0415
  from rmmjax.learners.iris.fit import (JudgeExamples, RankingExamples,  # noqa: PLC0415
                                         fit_judge, fit_ranking_encoder)
  rng = np.random.default_rng(0)
  encoder = SentenceEncoder()
  n, k, d = 32, 8, encoder.dim
  mem = rng.standard_normal((n, k, d)).astype(np.float32)
  covers = np.zeros((n, k, 2), bool)
  covers[:, 0, 0] = covers[:, 3, 1] = True
  ranking = RankingExamples(tuple(f"question {i} about the trip to Lisbon" for i in range(n)),
                            mem, covers)
  judging = JudgeExamples(rng.standard_normal((70, d)).astype(np.float32),
                          rng.standard_normal((70, 16, d)).astype(np.float32),
                          rng.random((70, 16)) < 0.7, rng.random(70) < 0.5)
  out = {}
  for name, fit in (("ranking_encoder", lambda mesh: fit_ranking_encoder(
      encoder, ranking, encoder.params, epochs=1, batch=8, lr=2e-5, tau=0.05, seed=0,
      mesh=mesh)), ("judge", lambda mesh: fit_judge(judging, epochs=3, batch=16, lr=1e-3,
                                                     seed=0, mesh=mesh))):
    (p1, l1), (p4, l4) = fit(None), fit(distributed.data_mesh(0))
    diffs = [float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
             for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p4))]
    out[name] = {"losses": float(np.max(np.abs(l1 - l4))), "steps": len(l1),
                 "params": max(diffs)}
  return out


def main_(out: str, data: str, root: str) -> None:
  root_path, report = Path(root), {"fits": _fits()}
  for name, args in PATHS.items():
    if "--config" in args and args[args.index("--config") + 1] == "locomo":
      args = [*args, "--set", f"data={data}"]
    runs = {}
    for devices in (1, 0):
      wd = root_path / f"{name}-{devices}"
      assert main(["train", *args, "--set", f"devices={devices}", "--workdir", str(wd),
                   "--quiet"]) == 0, name
      target = root_path / f"{name}-{devices}-export"
      target = (target if name in ("query_encoder", "iris_online")
                else target.with_suffix(".safetensors"))
      assert main(["export", "--workdir", str(wd), "--out", str(target)]) == 0, name
      runs[devices] = (wd, _weights(target))
    (one, w1), (every, w4) = runs[1], runs[0]
    rows1, rows4 = _rows(one), _rows(every)
    s1, s4 = (json.loads((wd / "summary.json").read_text()) for wd in (one, every))
    report[name] = {
        "rows": [len(rows1), len(rows4)],
        "metrics": max(abs(a[k] - b[k]) for a, b in zip(rows1, rows4) for k in a),
        "summary": max((abs(s1[k] - s4[k]) for k in s1 if isinstance(s1[k], float)),
                       default=0.0),
        "weights": max(float(np.max(np.abs(w1[k] - w4[k]))) for k in w1),
        "tensors": [len(w1), len(w4)],
        "pretrain": _pretrain_diff(one, every)}
  Path(out).write_text(json.dumps(report))


if __name__ == "__main__":
  main_(*sys.argv[1:])
