"""What every learner computes, pinned: a tiny run of each (the tiny BERT, the synthetic
conversations) trained from the command line, its exported weights summed, its summary's
figures and `eval`'s held-out metrics, against the values recorded in tests/pinned.json. A
change of code that changes what any learner learns or how it is measured fails here, naming
the learner and the value; a restructuring must leave every value as it was (float order may
move a figure by 1e-6, a weight's sum by 1e-5).

    RMMJAX_PIN=record pytest tests/test_pinned.py   # writes tests/pinned.json anew
"""

import json
import os
from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment
from safetensors.numpy import load_file

import synthetic_locomo
from cli_args import sets as _sets
from rmmjax.cli import main

PINNED = Path(__file__).with_name("pinned.json")
# Relative, beside the same absolute: a float order changed by a restructuring or another CPU's
# instructions moves a figure by 1e-6 at most, and a weight's sum over thousands of values by
# 1e-5; a changed computation moves them by far more.
TOLERANCE = {"weights": 1e-5, "summary": 1e-6, "eval": 1e-6}
LOCOMO = ("holdout=1", "dim=32", "log_every=4", "checkpoint_every=8")
RUNS = {
    "latent": ("latent", ("steps=40", "log_every=10", "checkpoint_every=20", "num_users=8",
                          "bank_size=32", "min_bank=12", "eval_sessions=16", "dim=16")),
    "linear": ("locomo", (*LOCOMO, "learner=linear", "retriever=bm25", "k=5",
                          "steps=8", "reranker.pretrain_epochs=2")),
    "mlp": ("locomo", (*LOCOMO, "learner=mlp", "reranker.hidden=16",
                       "retriever=hybrid", "k=5", "steps=8", "reranker.pretrain_epochs=2")),
    "cross": ("locomo", (*LOCOMO, "learner=cross", "k=5", "m=2", "batch=2",
                         "steps=4", "cross.max_length=48", "cross.pretrain_candidates=4",
                         "cross.pretrain_epochs=1")),
    "query_encoder": ("locomo", (*LOCOMO, "learner=query_encoder", "retriever=hybrid", "k=10",
                                 "encoder_tuning.steps=8", "encoder_tuning.pretrain_epochs=1")),
    "both": ("locomo", (*LOCOMO, "learner=query_encoder,linear", "retriever=hybrid", "k=10",
                        "encoder_tuning.steps=8", "encoder_tuning.pretrain_epochs=1",
                        "reranker.steps=8", "reranker.pretrain_epochs=1")),
    "iris_reranker": ("locomo", (*LOCOMO, "learner=linear", "units=lace", "k=24",
                                 "steps=8", "reranker.pretrain_epochs=1")),
    "iris": ("locomo", (*LOCOMO, "learner=iris", "units=lace", "retriever=hybrid",
                        "encoder_tuning.steps=8", "encoder_tuning.pretrain_epochs=1",
                        "encoder_tuning.pretrain_batch=4", "iris_models.k=32",
                        "checkpoint_every=8")),
}
# How `eval` measures each run's model (none for the simulator's).
EVAL = {"linear": ("--units", "turn", "--retriever", "bm25", "--reranker"),
        "mlp": ("--units", "turn", "--retriever", "hybrid", "--reranker"),
        "cross": ("--units", "turn", "--reranker"),
        "query_encoder": ("--units", "turn", "--retriever", "hybrid", "--encoder"),
        "both": ("--units", "turn", "--reranker"),
        "iris_reranker": ("--units", "lace", "--iris", "default", "--retriever", "hybrid",
                          "--reranker"),
        "iris": ("--units", "lace", "--iris", "learned", "--iris-model")}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  return synthetic_locomo.write(tmp_path_factory.mktemp("data") / "pin.json", 3, sessions=5,
                                turns=14)


def _weights(folder: Path) -> list[list[float]]:
  """Every exported float tensor as (size, sum, sum of squares), in a sorted list: names and
  files may move; the numbers may not."""
  files = [folder] if folder.is_file() else sorted(folder.rglob("*.safetensors"))
  stats = [[float(t.size), float(np.sum(t, dtype=np.float64)),
            float(np.sum(np.square(t, dtype=np.float64)))]
           for f in files for t in load_file(str(f)).values() if t.dtype.kind == "f"]
  return sorted(stats)


# What rounding alone moves an entry by, across machines: a tensor that gets no gradient but
# rounding (a bias that shifts every score alike) has entries of this size, each Adam's
# amplification of rounding that differs from one CPU's kernels to another's.
ENTRY_NOISE = 2e-5


def _same_tensors(found, pinned, tol: float) -> bool:
  """Whether the found tensors pair one to one with the pinned ones, each pair of one size with
  sum and sum of squares within tol (relative to the size of its entries) beside what an
  independent ENTRY_NOISE on every entry moves them by (three of its standard deviations).
  Paired by value, not by place in the sorted list, where two tensors of one size and nearly
  equal sums can swap, and as an assignment, not greedily: a zero tensor and one of rounding
  noise are each close to both pinned ones, and a greedy pairing can leave the wrong pair."""
  if len(found) != len(pinned):
    return False
  found, pinned = np.asarray(found, float), np.asarray(pinned, float)
  size, total, squares = (found[:, None, i] for i in range(3))
  close = ((size == pinned[:, 0])
           & (abs(squares - pinned[:, 2]) <= tol * pinned[:, 2]
              + 6 * ENTRY_NOISE * np.sqrt(pinned[:, 2]))
           & (abs(total - pinned[:, 1]) <= tol * np.sqrt(pinned[:, 0] * pinned[:, 2])
              + 3 * ENTRY_NOISE * np.sqrt(size)))
  rows, cols = linear_sum_assignment(~close)
  return bool(close[rows, cols].all())


TIMED = ("latency", "_ms", "seconds")  # what the clock gives, not the code


def _numbers(tree, prefix="") -> dict[str, float]:
  """The numbers of a JSON tree, by path (timings left out)."""
  if isinstance(tree, dict):
    return {k: v for key, sub in tree.items() for k, v in _numbers(sub, f"{prefix}{key}/").items()}
  if isinstance(tree, bool) or not isinstance(tree, (int, float)) or any(
      t in prefix for t in TIMED):
    return {}
  return {prefix.rstrip("/"): float(tree)}


def pinned_values(name: str, data: Path, tmp: Path) -> dict:
  config, sets = RUNS[name]
  wd = tmp / name
  args = ["train", "--config", config, "--workdir", str(wd), "--quiet",
          *_sets(*(() if config == "latent" else (f"data={data}",)), *sets)]
  assert main(args) == 0
  out = tmp / f"{name}.export"
  out = out.with_suffix(".safetensors") if name in ("latent", "linear", "mlp", "iris_reranker") \
      else out
  assert main(["export", "--workdir", str(wd), "--out", str(out)]) == 0
  summary = json.loads((wd / "summary.json").read_text())
  values = {"weights": _weights(out),
            "summary": _numbers(summary)}
  if name in EVAL:
    report = tmp / f"{name}.eval.json"
    assert main(["eval", "--data", str(data), "--quiet", "--k", "2,5", *EVAL[name], str(wd),
                 "--out", str(report)]) == 0
    values["eval"] = _numbers(json.loads(report.read_text())["metrics"])
  return values


def _close(a, b, part: str) -> bool:
  tol = TOLERANCE[part]
  return np.allclose(np.asarray(a, float), np.asarray(b, float), rtol=tol, atol=tol)


@pytest.mark.usefixtures("tiny_encoder")
@pytest.mark.parametrize("name", list(RUNS))
def test_every_learner_computes_what_it_was_pinned_to(name, data, tmp_path):
  values = pinned_values(name, data, tmp_path)
  recorded = json.loads(PINNED.read_text()) if PINNED.exists() else {}
  if os.environ.get("RMMJAX_PIN") == "record":
    PINNED.write_text(json.dumps(recorded | {name: values}, indent=1, sort_keys=True) + "\n")
    return
  assert name in recorded, f"{PINNED} holds no values for {name}: record them"
  pinned = recorded[name]
  assert len(values["weights"]) == len(pinned["weights"]), "the exported tensors differ"
  assert _same_tensors(values["weights"], pinned["weights"], TOLERANCE["weights"]), \
      f"{name}: the weights moved"
  for part in ("summary", "eval"):
    for key, value in pinned.get(part, {}).items():
      assert key in values[part], f"{name}: {part} no longer reports {key}"
      assert _close(values[part][key], value, part), f"{name}: {part} {key} {value} -> " \
                                               f"{values[part][key]}"


def test_tensors_pair_as_an_assignment_and_a_moved_one_fails():
  zero, noise, real = [32.0, 0.0, 0.0], [32.0, -5.2e-05, 2.3e-09], [32.0, 1.5, 4.0]
  found_noise = [32.0, 2.6e-05, 1.2e-09]  # another CPU's rounding of the same noise tensor
  assert _same_tensors([zero, found_noise, real], [noise, zero, real], 1e-5)
  assert not _same_tensors([zero, found_noise, [32.0, 1.6, 4.0]], [noise, zero, real], 1e-5)
  assert not _same_tensors([zero, real], [noise, zero, real], 1e-5)
