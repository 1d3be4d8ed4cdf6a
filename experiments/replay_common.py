"""What the replay experiments share: the data location and the LoCoMo candidates."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from rmmjax import core
from rmmjax.eval.intervals import paired_interval

from rmmjax.data.locomo import load_locomo
from rmmjax.encode.cache import EmbeddingCache, cache_path
from rmmjax.encode.encoder import SentenceEncoder
from rmmjax.replay.candidates import build_replay

ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = Path(os.environ.get("RMMJAX_DATA", ROOT.parent / "shared" / "data"))
DEFAULT_DATA = DATA_DIR / "locomo" / "locomo_dev8.json"
RESULTS = Path(__file__).parent / "results"
CATEGORIES = ("multi-hop", "temporal", "single-hop", "open-domain", "adversarial")


def fold_clusters(conversations: list[str], num_folds: int) -> dict[str, int]:
  """conversation id -> its fold (rmmjax.replay.candidates.folds over the file's order): the
  unit a cross-validation's bootstrap resamples, since a fold's conversations share a model."""
  from rmmjax.replay.candidates import folds  # noqa: PLC0415
  ids = list(dict.fromkeys(conversations))
  return {ids[i]: f for f, fold in enumerate(folds(len(ids), num_folds)) for i in fold}


def paired(results: dict, a: str, b: str, folds: dict[str, int],
           category: str | None = None) -> str:
  """Row a - row b over the same questions (of `category`, if given), with the one interval
  (rmmjax.eval.intervals: folds resampled where there are enough, else conversations; `folds`
  maps each conversation to its fold) and what it resampled. A row saved with every seed's
  values (`per_seed_question`) is paired seed by seed, its seeds resampled too."""
  if any(results[a][key] != results[b][key] for key in ("categories", "conversations")):
    raise ValueError(f"{a!r} and {b!r} do not list the same questions in the same order")
  cats, convs = np.array(results[a]["categories"]), np.array(results[a]["conversations"])
  keep = np.ones(len(cats), bool) if category is None else cats == category
  values = lambda r: np.atleast_2d(r.get("per_seed_question", r["per_question"]))  # noqa: E731
  diff = (values(results[a]) - values(results[b]))[:, keep]
  return str(paired_interval(diff, convs[keep], [folds[c] for c in convs[keep]]))


def seed_hparams(cfg, seeds: int, **changes) -> core.HParams:
  """The config's hyperparameters with `changes`, for seeds 0..seeds-1 (a leading axis)."""
  from rmmjax.config import with_values  # noqa: PLC0415
  return core.stack_hparams([with_values(cfg, {"seed": s, **changes}).hparams()
                             for s in range(seeds)])


def locomo_replays(data: Path, retriever: str, k: int, units: str = "turn"):
  conversations, _ = load_locomo(Path(data))
  encoder = SentenceEncoder(cache=EmbeddingCache(cache_path()))
  return build_replay(conversations, units, retriever, encoder, k)


def provenance() -> dict:
  """What a results file records of how it was made: the command line and the commit it ran
  at (with whether the work tree had changes beside it)."""
  import subprocess  # noqa: PLC0415
  import sys  # noqa: PLC0415
  git = lambda *a: subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True,  # noqa
                                  text=True).stdout.strip()
  return {"command": "python " + " ".join(["experiments/" + Path(sys.argv[0]).name]
                                          + sys.argv[1:]),
          "commit": git("rev-parse", "HEAD") or "unknown",
          "uncommitted_changes": bool(git("status", "--porcelain", "--", "rmmjax",
                                          "experiments/*.py"))}


def provenance_line(saved: dict) -> str:
  """One line for a results .md: the command and the commit that made the saved rows."""
  made = saved.get("provenance")
  if not made:
    return "Command and commit: not recorded (the run predates their recording)."
  dirty = " with uncommitted changes" if made["uncommitted_changes"] else ""
  return f"Made by `{made['command']}` at commit {made['commit'][:12]}{dirty}."


def write_markdown(path: Path, lines: list[str], saved: dict | None = None) -> None:
  """A results table, ending with the command and commit that made it: `saved`'s (the results
  it is written from), and this command's too where it only wrote them again."""
  now = provenance()
  made = provenance_line(saved if saved is not None else {"provenance": now})
  if saved is not None and saved.get("provenance") != now:
    made += (f" Written again from the saved results by `{now['command']}` at commit "
             f"{now['commit'][:12]}{' with uncommitted changes' * now['uncommitted_changes']}.")
  Path(path).write_text("\n".join(lines + ["", made]) + "\n")


# The locomo config's values as the replay experiments measured them, pinned, so that a default
# changing later cannot change what their rows mean (each script sets what it varies itself).
# learner=query_encoder,linear holds both sections the experiments read: the linear reranker's
# and the query encoder's.
LOCOMO_AS_MEASURED = (
    "learner=query_encoder,linear", "k=20", "m=5", "batch=4", "dim=384", "baseline=0.0",
    "baseline_kind=running", "mode=pretrain+rl", "seed=0", "reranker.rank_prior=true",
    "reranker.tau=0.05", "reranker.lr=1e-4", "reranker.pretrain_epochs=10",
    "reranker.pretrain_lr=1e-4", "reranker.pretrain_tau=0.05", "reranker.steps=600",
    "encoder_tuning.pretrain_epochs=2", "encoder_tuning.pretrain_lr=2e-5",
    "encoder_tuning.pretrain_tau=0.05", "encoder_tuning.pretrain_batch=16",
    "encoder_tuning.lr=1e-5", "encoder_tuning.tau=0.05", "encoder_tuning.steps=600",
    "encoder_tuning.tune=query")


def locomo_config(**changes):
  """The locomo config with every value the replay experiments' rows rely on pinned (a key of
  a section by its name alone is the reranker's)."""
  from rmmjax.config import apply_overrides, get_config, with_values  # noqa: PLC0415
  return with_values(apply_overrides(get_config("locomo"), list(LOCOMO_AS_MEASURED)), changes)
