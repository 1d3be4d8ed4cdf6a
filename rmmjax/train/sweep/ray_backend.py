"""Where a sweep's runs execute with `--on ray`, never what they compute: a task calls the
function the sweep calls in one process (runs.run_one, replay.fold_task, train). See docs/ray.md."""

from __future__ import annotations

import collections
import contextlib
import fcntl
import json
import math
import os
import socket
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

from rmmjax.io.record import file_sha256
from rmmjax.io.workdir import atomic_write_json
from rmmjax.train.sweep.chunks import minutes, time_left

INSTALL = 'pip install -e ".[ray]"'
RECORDS = "ray"  # the folder of each task's record in the sweep's workdir
RETRIES = 3  # a worker's death (a system failure) is retried this often; an error is not
# What a task's process takes from the driver's environment (a worker on another node starts
# with its own): the encoder, JAX's platform and flags.
FORWARDED = ("RMMJAX_", "JAX_", "XLA_", "HF_", "TF_CPP_")
_held_cores: list[int] = []  # the core locks this process holds until it exits


def parse_resources(text: str | None) -> dict[str, float]:
  """"cpu=2,gpu=1" -> {"num_cpus": 2.0, "num_gpus": 1.0}: what each task reserves."""
  out = {}
  for item in () if text is None else text.split(","):
    key, _, value = (s.strip().lower() for s in item.partition("="))
    try:
      amount = float(value)  # ("cpu" alone: no value, refused here too)
    except ValueError:
      amount = -1.0
    if key not in ("cpu", "gpu") or not 0 < amount <= 1024:
      raise ValueError(f"--run-resources {text!r}: expected cpu=N and/or gpu=N, comma "
                       "separated, each N above 0 (e.g. gpu=1 or cpu=2)")
    out[f"num_{key}s"] = amount
  return out


class RayBackend:
  """Runs a sweep's tasks on the Ray cluster at `address`, else one started here (stopped by
  `close`). `resources`: what each task reserves (parse_resources)."""

  def __init__(self, address: str | None, resources: dict[str, float], progress: bool = True):
    try:
      import ray  # noqa: PLC0415 (an optional extra: imported only by a sweep --on ray)
    except ImportError:
      raise ValueError(f"--on ray: Ray is not installed; install it with {INSTALL}") from None
    self.ray = ray
    self.address, self.resources, self.progress = address, dict(resources), progress
    self._started = False
    self._workdir, self._data = None, None

  def prepare(self, workdir: Path, data: Path, sha256: str) -> None:
    """The sweep's workdir (its tasks' records go in ray/), the data file every task reads and
    the hash the sweep recorded of it."""
    self._workdir, self._data = Path(workdir).resolve(), (Path(data).resolve(), sha256)

  def _connect(self, report) -> None:
    ray = self.ray
    if not ray.is_initialized():
      context = ray.init(address=self.address, log_to_driver=False, configure_logging=False)
      self._started = True
      url = getattr(context, "dashboard_url", None)
      total, nodes = ray.cluster_resources(), sum(1 for n in ray.nodes() if n["Alive"])
      report(f"ray: {'connected to ' + self.address if self.address else 'started here'} "
             f"({nodes} node{'s' if nodes > 1 else ''}, {total.get('CPU', 0):g} CPUs, "
             f"{total.get('GPU', 0):g} GPUs)" + (f"; dashboard http://{url}" if url else ""))
    if not self.resources:
      has_gpu = ray.cluster_resources().get("GPU", 0) >= 1
      self.resources = {"num_gpus": 1.0} if has_gpu else {"num_cpus": 1.0}
    for name, amount in self.resources.items():
      kind = name[4:-1].upper()  # num_cpus -> CPU
      most = max((n["Resources"].get(kind, 0) for n in ray.nodes() if n["Alive"]), default=0)
      if amount > most:
        raise ValueError(f"--run-resources {kind.lower()}={amount:g}: no node of the Ray "
                         f"cluster has {amount:g} {kind} (the most on one is {most:g}); ask "
                         "for less")

  def run(self, tasks: list[tuple], report) -> None:
    """Runs `tasks` ((key, what, function, args) each: function(*args) as a task, `what`
    naming it) and returns when all have ended; refuses, naming each, if some failed."""
    ray = self.ray
    self._connect(report)
    workdir = self._workdir
    env = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED)}
    # (workers import the driver's rmmjax, from the same folder: on a cluster, shared storage)
    here = str(Path(__file__).resolve().parents[3])  # (the folder holding rmmjax/)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    remote = ray.remote(**self.resources, max_retries=RETRIES, retry_exceptions=False,
                        max_calls=1, runtime_env={"env_vars": env})(_execute)
    cpus = math.ceil(self.resources.get("num_cpus", 1))
    records = {key: workdir / RECORDS / f"{key}.json" for key, *_ in tasks}
    for path in records.values():  # (a fresh count of attempts for each try of the sweep)
      path.unlink(missing_ok=True)
    refs = {remote.remote(fn, args, records[key], *self._data, cpus): (key, what)
            for key, what, fn, args in tasks}
    shown = ", ".join(f"{v:g} {k[4:-1].upper()}" for k, v in self.resources.items())
    report(f"ray: {len(tasks)} tasks of {shown} each, as many at once as the cluster holds")
    failed, finished, started = [], 0, time.perf_counter()
    pending = list(refs)
    try:
      with tqdm(total=len(tasks), desc="sweep runs", unit="run",
                disable=not self.progress) as bar:
        while pending:
          done, pending = ray.wait(pending, num_returns=1, timeout=2.0)
          bar.set_postfix_str(_where([records[refs[r][0]] for r in pending]), refresh=False)
          for ref in done:
            key, what = refs[ref]
            error = _error(ray, ref)
            if error:
              failed.append(f"{what}: {error}")
              _note(records[key], {"failed": error})
            bar.update(1)
            finished += 1  # (a disabled bar counts nothing)
            at = _read(records[key])
            report(time_left(f"{what} ({'FAILED' if error else 'ran'} on "
                             f"{at.get('host', '?')}, pid {at.get('pid', '?')}, attempt "
                             f"{at.get('attempt', '?')})", finished, len(tasks),
                             time.perf_counter() - started))
    finally:
      for ref in pending:  # (stopped: nothing of this sweep keeps running on the cluster)
        with contextlib.suppress(Exception):
          ray.cancel(ref, force=True)
    if failed:
      raise ValueError(f"{len(failed)} of {len(tasks)} tasks failed, the others finished and "
                       f"are kept (records in {workdir / RECORDS}); fix the cause and run the "
                       "same command again: " + "; ".join(failed))
    report(f"ray: {len(tasks)} tasks in {minutes(time.perf_counter() - started)}")

  def close(self) -> None:
    if self._started:  # (a cluster this sweep started; one it connected to stays up)
      self.ray.shutdown()
      self._started = False

  def __enter__(self):
    return self

  def __exit__(self, *_):
    self.close()


def _execute(fn, args, record: Path, data: Path, sha256: str, cpus: int):
  """A task: its cores taken, its data file checked, where it runs recorded, then fn(*args)."""
  cores = _take_cores(cpus)
  attempt = _read(record).get("attempt", 0) + 1
  _note(record, {"host": socket.gethostname(), "pid": os.getpid(), "cores": cores,
                 "started": time.time(), "attempt": attempt}, fresh=True)
  found = file_sha256(data) if data.is_file() else "missing"
  if found != sha256:
    raise ValueError(f"{data} on {socket.gethostname()} is not the file this sweep recorded "
                     f"(sha256 {found[:12]}, recorded {sha256[:12]}): every node must read the "
                     "same data file (keep it on storage every node sees)")
  result = fn(*args)
  _note(record, {"ended": time.time()})
  return result


def _take_cores(n: int) -> list[int] | None:
  """Pins this process to n of its node's cores that no other task holds (docs/ray.md), before
  JAX sizes its thread pool; None (unpinned) where it has no more than n, or n are not free."""
  cores = sorted(os.sched_getaffinity(0))
  if n >= len(cores):
    return None
  folder = Path(tempfile.gettempdir()) / "rmmjax-cores"
  folder.mkdir(exist_ok=True)
  for core in cores:
    fd = os.open(folder / str(core), os.O_CREAT | os.O_RDWR, 0o666)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      os.close(fd)
      continue
    _held_cores.append(fd)
    if len(_held_cores) == n:
      break
  if len(_held_cores) < n:  # (cores taken by a process Ray does not count: left unpinned)
    while _held_cores:
      os.close(_held_cores.pop())
    return None
  taken = [int(Path(os.readlink(f"/proc/self/fd/{fd}")).name) for fd in _held_cores]
  os.sched_setaffinity(0, taken)
  os.environ["OMP_NUM_THREADS"] = str(n)
  return taken


def _read(record: Path) -> dict:
  try:
    return json.loads(Path(record).read_text())
  except (OSError, ValueError):
    return {}


def _note(record: Path, values: dict, fresh: bool = False) -> None:
  """Adds `values` to a task's record (or, `fresh`, replaces it with them)."""
  atomic_write_json(record, ({} if fresh else _read(record)) | values)


def _error(ray, ref) -> str:
  """A finished task's failure in one line (empty when it succeeded)."""
  try:
    ray.get(ref)
  except ray.exceptions.RayTaskError as err:  # the run's own error, raised once
    cause = err.cause if err.cause is not None else err
    return f"{type(cause).__name__}: {str(cause).strip().splitlines()[-1]}"
  except ray.exceptions.RayError as err:  # a worker's death, after its retries
    return f"{type(err).__name__}: {str(err).strip().splitlines()[0]} (after {RETRIES} retries)"
  return ""


def _where(records: list[Path]) -> str:
  """Where the started tasks run: 'running: 2 on host-a, 1 on host-b'."""
  hosts = collections.Counter(at["host"] for at in map(_read, records)
                              if "started" in at and "ended" not in at)
  return ("running: " + ", ".join(f"{n} on {h}" for h, n in hosts.items())) if hosts else ""


