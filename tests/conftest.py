"""Test settings: CPU, strict promotion rules, and the location of the shared data."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_numpy_dtype_promotion", "strict")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

# The real data lives in ../shared/data beside the project; RMMJAX_DATA may point elsewhere.
DATA_DIR = Path(os.environ.get("RMMJAX_DATA",
                               Path(__file__).resolve().parents[1].parent / "shared" / "data"))


def _shared_file(relative: str, source: str) -> Path:
  path = DATA_DIR / relative
  if not path.exists():
    if os.environ.get("CI"):
      pytest.fail(f"{path} is missing; CI must have the shared data")
    pytest.skip(f"{path} not found: set RMMJAX_DATA to a folder holding {relative} ({source})")
  return path


@pytest.fixture
def locomo_path() -> Path:
  return _shared_file("locomo/locomo_dev8.json",
                      "the LoCoMo release, github.com/snap-research/LoCoMo, data/locomo10.json")


@pytest.fixture
def msc_path() -> Path:
  return _shared_file("msc/msc_dialogue/session_3/valid.txt",
                      "ParlAI's msc_v0.1 release, msc_dialogue/session_3/valid.txt")
