"""Test settings: CPU, strict promotion rules, and the location of the shared data."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_numpy_dtype_promotion", "strict")
# Full float32 matmuls on every platform, so the parity tests (fast = naive scorer, export =
# JAX, encoder = sentence-transformers) mean the same on an accelerator as on the CPU.
jax.config.update("jax_default_matmul_precision", "highest")

import json  # noqa: E402
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
def on_four_devices():
  """Runs a Python script in a fresh process that sees 4 (fake CPU) devices; returns stdout."""
  import subprocess  # noqa: PLC0415
  import sys  # noqa: PLC0415
  import textwrap  # noqa: PLC0415

  def run(script: str) -> str:
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
               JAX_PLATFORMS="cpu")
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout

  return run


@pytest.fixture(scope="session")
def locomo_path() -> Path:
  return _shared_file("locomo/locomo_dev8.json",
                      "the LoCoMo release, github.com/snap-research/LoCoMo, data/locomo10.json")


@pytest.fixture(scope="session")
def msc_path() -> Path:
  return _shared_file("msc/msc_dialogue/session_3/valid.txt",
                      "ParlAI's msc_v0.1 release, msc_dialogue/session_3/valid.txt")


@pytest.fixture(scope="session")
def three(locomo_path, tmp_path_factory) -> Path:
  """The dev file's first three conversations: small command-line training runs."""
  path = tmp_path_factory.mktemp("data") / "three.json"
  path.write_text(json.dumps(json.loads(locomo_path.read_text())[:3]))
  return path
