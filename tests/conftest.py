"""Test settings: CPU, strict promotion rules, the shared fixtures, and where the real data is.

Every test of the LoCoMo pipeline runs on small conversations the suite builds (`three`,
tests/helpers/synthetic_locomo.py); the tests of the real files (their documented counts, the
measured baselines) read ../shared/data beside the project, or RMMJAX_DATA, and skip without it
saying where to get it (in CI they fail instead).
"""

import os
import shutil
import sys
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The suite compiles hundreds of small programs and runs each a few times, so LLVM's optimisation
# of the compiled CPU code costs more than it saves: without it a tiny BERT's training step
# compiles about four times faster. Subprocesses inherit it with the rest of the environment.
# Fake devices (--xla_force_host_platform_device_count) are threads on the same cores: on a
# loaded machine one may join a collective late, and XLA aborts the process after 40 seconds.
SUITE_XLA_FLAGS = ("--xla_backend_optimization_level=0 "
                   "--xla_cpu_collective_call_terminate_timeout_seconds=600")
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {SUITE_XLA_FLAGS}".strip()

import jax  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_numpy_dtype_promotion", "strict")
# Full float32 matmuls on every platform, so the parity tests (fast = naive scorer, export =
# JAX, encoder = sentence-transformers) mean the same on an accelerator as on the CPU.
jax.config.update("jax_default_matmul_precision", "highest")


def _entries_written_whole() -> bool:
  """Makes JAX write each entry of its cache of compiled programs under a name of its own and
  rename it into place, so that another process never reads one half written (JAX writes in
  place). False where this JAX's cache is not the one this knows: its processes then keep a
  cache each."""
  try:
    from jax._src import lru_cache  # noqa: PLC0415
    cache, suffix, put = lru_cache.LRUCache, lru_cache._CACHE_SUFFIX, lru_cache.LRUCache.put
  except (ImportError, AttributeError):
    return False
  if getattr(put, "writes_whole", False):
    return True

  def put_whole(self, key, value):
    if not key or getattr(self, "eviction_enabled", True):  # (a bounded cache locks its writes)
      return put(self, key, value)
    path = self.path / f"{key}{suffix}"
    if not path.exists():
      part = self.path / f".{key}.{os.getpid()}.part"
      part.write_bytes(value)
      os.replace(part, path)

  put_whole.writes_whole = True
  cache.put = put_whole
  return True


# The suite trains many tiny runs of the same shapes, and each run compiles its programs anew:
# the processes of one run of the suite (pytest's, and xdist's workers, which inherit the cache's
# name from it) share one cache of what they compiled, removed by the process that made it when
# it ends, so that a file's tests load the programs another worker compiled for another file.
# Its entries are written whole (above): two processes writing one entry at once cannot leave
# it torn. Not for the processes a test starts (set here, not in the environment JAX reads):
# they would write their entries in place.
COMPILED, OWN_CACHE = os.environ.get("RMMJAX_TESTS_COMPILED", ""), False
if not (COMPILED and os.path.isdir(COMPILED) and _entries_written_whole()):
  COMPILED, OWN_CACHE = tempfile.mkdtemp(prefix="rmmjax-tests-compiled-"), True
  if _entries_written_whole():
    os.environ["RMMJAX_TESTS_COMPILED"] = COMPILED
jax.config.update("jax_compilation_cache_dir", COMPILED)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

HELPERS = Path(__file__).resolve().parent / "helpers"  # the stand-ins and servers tests share
sys.path.insert(0, str(HELPERS))

import synthetic_locomo  # noqa: E402

# The real data lives in ../shared/data beside the project; RMMJAX_DATA may point elsewhere.
DATA_DIR = Path(os.environ.get("RMMJAX_DATA",
                               Path(__file__).resolve().parents[1].parent / "shared" / "data"))

# The files that take longest, longest first. A file runs in one process (--dist loadfile), in
# the order collected; one of these started last, while the other cores sit idle, would set the
# suite's time, so they start first and the many short files fill in around them.
LONGEST_FIRST = [f"tests/{name}.py" for name in (
    "learners/test_cross_runs", "train/test_distributed", "train/test_replay_sweep",
    "learners/test_iris_models_runs", "llm/test_llm_server", "train/test_ray_sweep", "test_pinned",
    "eval/test_answer_cli", "learners/test_query_encoder_runs", "train/test_sweep_grid",
    "learners/test_iris_cross", "cli/test_chat_cli", "cli/test_cli", "train/test_workdir")]


def pytest_configure(config):
  # xdist 3.6 and later hand out the files with the most tests first unless told not to, which
  # would undo the order above.
  if hasattr(config.option, "loadscopereorder"):
    config.option.loadscopereorder = False


def pytest_unconfigure(config):
  if OWN_CACHE:
    shutil.rmtree(COMPILED, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
  rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # (stable)


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
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"{os.environ['XLA_FLAGS']} --xla_force_host_platform_device_count=4")
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
def tiny_encoder_dir(tmp_path_factory) -> Path:
  """A tiny BERT encoder's directory (tests/helpers/tiny_bert.py)."""
  import tiny_bert  # noqa: PLC0415
  return tiny_bert.write_tiny_encoder(tmp_path_factory.mktemp("encoders") / "tiny")


@pytest.fixture(scope="module")
def tiny_encoder(tiny_encoder_dir):
  """The tiny encoder as every command's default (RMMJAX_ENCODER) for a module's tests: for
  logic that any BERT exercises, in a fraction of MiniLM's compile time (its dimension is 32:
  training configs take dim=32)."""
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv("RMMJAX_ENCODER", str(tiny_encoder_dir))
    yield tiny_encoder_dir


@pytest.fixture(scope="session")
def three(tmp_path_factory) -> Path:
  """Three synthetic LoCoMo conversations (syn-1, syn-2, syn-3): small training runs and every
  test of the pipeline that does not test the real file itself."""
  return synthetic_locomo.write(tmp_path_factory.mktemp("data") / "three.json", 3, sessions=4,
                                turns=12)


@pytest.fixture(scope="session")
def long_conversation(tmp_path_factory) -> Path:
  """One synthetic conversation of 12 sessions of 16 turns (192 turns), for what needs more
  units than `three` holds."""
  return synthetic_locomo.write(tmp_path_factory.mktemp("data") / "long.json", 1, sessions=12,
                                turns=16)
