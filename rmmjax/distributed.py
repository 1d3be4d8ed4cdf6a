"""More than one device, more than one host, on JAX's own runtime: the compiler partitions a
step over the one-axis "data" mesh and inserts the gradient all-reduce (docs/distributed.md)."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import socket
import sys
import time

from pathlib import Path

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rmmjax.encode.cache import per_host

DATA_AXIS = "data"
# Environment variables that say a cluster launched this process with others: a count above 1,
# or (the last) a comma-separated list of hosts.
_CLUSTER_ENV = ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "TPU_WORKER_HOSTNAMES")


def _launched_by_cluster() -> bool:
  values = [os.environ.get(name, "") for name in _CLUSTER_ENV]
  return "," in values[-1] or any(v.isdigit() and int(v) > 1 for v in values)


def check_flags(coordinator: str | None, num_processes: int | None,
                process_id: int | None, timeout_s: int = 60) -> None:
  """Refuses flags that cannot start a run, before anything is compiled or written."""
  if isinstance(timeout_s, bool) or not isinstance(timeout_s, int) or timeout_s < 1:
    raise ValueError(f"--distributed-timeout {timeout_s}: expected a positive number of seconds")
  given = [x is not None for x in (coordinator, num_processes, process_id)]
  if any(given) and not all(given):
    raise ValueError("--coordinator, --num-processes and --process-id go together: give all "
                     "three (or none, to run on this machine or let the cluster's environment "
                     "say)")
  if not any(given):
    return
  if not re.fullmatch(r"(\[[0-9a-fA-F:.]+\]|[^\s:\[\]]+):\d+", coordinator):
    raise ValueError(f"--coordinator {coordinator!r}: expected HOST:PORT, e.g. 10.0.0.1:8476 "
                     f"or [::1]:8476")
  if not 0 < int(coordinator.rsplit(":", 1)[1]) < 65536:
    raise ValueError(f"--coordinator {coordinator!r}: the port must be 1 to 65535")
  if num_processes < 1:
    raise ValueError(f"--num-processes {num_processes}: expected at least 1")
  if not 0 <= process_id < num_processes:
    raise ValueError(f"--process-id {process_id}: expected 0 to {num_processes - 1} for "
                     f"--num-processes {num_processes}")


def initialize(coordinator: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, timeout_s: int = 60) -> bool:
  """Starts jax.distributed when asked (or when a cluster launched this process); True if it
  did. A coordinator that cannot be reached fails within timeout_s with the address."""
  check_flags(coordinator, num_processes, process_id, timeout_s)
  if coordinator is None and not _launched_by_cluster():
    return False
  if coordinator is not None:
    if process_id != 0:
      _wait_for(coordinator, timeout_s)
    # The runtime ends the process itself (SIGABRT, a stack trace) when the processes do not
    # all join in time; this line says what it was waiting for.
    print(f"process {process_id} of {num_processes}: joining {coordinator} (waiting at most "
          f"{timeout_s} s for every process)", file=sys.stderr, flush=True)
  # CPU devices need a collectives library to talk across processes (it leaves accelerators'
  # own alone); asking for the backend here would start it before the runtime, so always set.
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  try:
    jax.distributed.initialize(coordinator, num_processes, process_id,
                               initialization_timeout=timeout_s)
  except Exception as err:  # the runtime raises several kinds (XlaRuntimeError, RuntimeError)
    where = coordinator or "the cluster's coordinator"
    raise ValueError(f"could not start the distributed runtime with {where} (process "
                     f"{process_id} of {num_processes}, waiting at most {timeout_s} s): "
                     f"{str(err).splitlines()[0][:300]}") from None
  return True


def _wait_for(coordinator: str, timeout_s: int) -> None:
  """Refuses, within timeout_s, a coordinator nothing listens at (process 0 starts it)."""
  host, port = coordinator.rsplit(":", 1)
  host = host.strip("[]")
  deadline = time.monotonic() + timeout_s
  while True:
    try:
      socket.create_connection((host, int(port)), timeout=2).close()
      return
    except OSError as err:
      if time.monotonic() > deadline:
        raise ValueError(f"--coordinator {coordinator}: nothing answered within {timeout_s} s "
                         f"({err}); start process 0 with the same --coordinator, or check the "
                         f"address and port") from None
      time.sleep(0.5)


def host_cache(path: Path) -> Path:
  """The embedding cache this process uses: over several, this host's own file beside `path`."""
  if jax.process_count() == 1:
    return path
  return per_host(Path(path), socket.gethostname())


def is_writer() -> bool:
  """Whether this process writes the run's files (process 0 does; the others compute)."""
  return jax.process_index() == 0


def data_mesh(num_devices: int = 0) -> Mesh:
  """A one-axis mesh over the first num_devices devices of every process (0: all of them)."""
  devices = jax.devices()
  if num_devices > len(devices):  # (the config bounds it below by 0)
    raise ValueError(f"devices={num_devices}: this run sees {len(devices)} "
                     f"device{'' if len(devices) == 1 else 's'} "
                     f"({jax.process_count()} processes); expected 0 (all) to {len(devices)}")
  if num_devices and num_devices < len(devices) and jax.process_count() > 1:
    raise ValueError(f"devices={num_devices}: a run over {jax.process_count()} processes uses "
                     f"every device ({len(devices)}); set devices=0")
  return Mesh(np.array(devices[:num_devices or len(devices)]), (DATA_AXIS,))


def check_fills(count: int, size: int, what: str, key: str = "batch") -> None:
  """Refuses a batch of `size` that `count` items (`what`) cannot fill once: a larger one
  would be padded, or leave nothing to train on."""
  if size > count:
    raise ValueError(f"{key}={size}: the {count:,} {what} cannot fill one batch; expected "
                     f"{key} <= {count:,}")


def check_divisible(size: int, mesh: Mesh, what: str) -> None:
  n = mesh.devices.size
  if size % n:
    raise ValueError(f"{what} of {size} does not divide over {n} devices: choose a multiple of "
                     f"{n} (or devices=1)")


def shard_leading(tree, mesh: Mesh, axis: int = 0):
  """Every array of tree split along `axis` over the mesh, the rest of it replicated; each
  process supplies the slices its own devices hold (all processes pass the same full data)."""
  def place(x):
    x = np.asarray(x)
    check_divisible(x.shape[axis], mesh, f"axis {axis} of an array of shape {x.shape}")
    spec = PartitionSpec(*([None] * axis), DATA_AXIS)
    return jax.make_array_from_callback(x.shape, NamedSharding(mesh, spec), lambda i: x[i])
  return jax.tree.map(place, tree)


def replicate(tree, mesh: Mesh):
  """Every array of tree whole on every device of the mesh (not copied where it already is)."""
  sharding = NamedSharding(mesh, PartitionSpec())

  def place(x):
    if isinstance(x, jax.Array) and x.sharding.is_equivalent_to(sharding, x.ndim):
      return x
    host = np.asarray(gather(x))
    return jax.make_array_from_callback(host.shape, sharding, lambda i: host[i])
  return jax.tree.map(place, tree)


def batch_sharding(mesh: Mesh, axis: int = 0) -> NamedSharding | None:
  """Axis `axis` (the batch's) split over the mesh; None on one device."""
  if mesh.devices.size == 1:
    return None
  return NamedSharding(mesh, PartitionSpec(*([None] * axis), DATA_AXIS))


def gather(tree):
  """numpy copies of tree on every process (arrays spread over processes are all-gathered)."""
  def get(x):
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
      if x.is_fully_replicated:
        return np.asarray(x.addressable_data(0))
      return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))
  return jax.tree.map(get, tree)


def barrier(name: str) -> None:
  """Waits until every process gets here (a no-op in one process)."""
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


def digest(*parts: str | bytes) -> str:
  h = hashlib.sha256()
  for part in parts:
    h.update(part.encode() if isinstance(part, str) else part)
    h.update(b"\0")
  return h.hexdigest()


# The refusals a pre-flight shares (what the command line reports as a bad input); a message
# travels cut to this many characters, in a row of JSON (ASCII: up to 12 bytes a character).
REFUSALS = (ValueError, FileNotFoundError, PermissionError, IsADirectoryError)
_MESSAGE_CHARS = 2048


@dataclasses.dataclass
class Preflight:
  """What a process found before its run starts: set `digest` (of what it was started with)
  and `step` (where it resumes) inside the `preflight` block."""

  digest: str = ""
  step: int = 0


@contextlib.contextmanager
def preflight(what: str):
  """Runs the checks in its block on every process: a refusal raised on any is raised on all,
  and processes whose digests or resumed steps differ are refused on all."""
  found = Preflight()
  if jax.process_count() == 1:
    yield found
    return
  try:
    yield found
  except REFUSALS as err:
    _compare(what, found, f"{err}")
    raise
  _compare(what, found, None)


def _compare(what: str, found: Preflight, refusal: str | None) -> None:
  sent = json.dumps([refusal and refusal[:_MESSAGE_CHARS], found.step, found.digest])
  row = np.frombuffer(sent.encode().ljust(12 * _MESSAGE_CHARS + 256, b"\0"), np.uint8)
  rows = np.asarray(multihost_utils.process_allgather(row)).reshape(-1, row.size)
  if refusal is not None:
    return  # this process raises its own refusal
  got = [json.loads(r.tobytes().rstrip(b"\0")) for r in rows]
  for i, (message, _, _) in enumerate(got):
    if message is not None:
      raise ValueError(f"process {i} refused this run: {message}")
  steps = [step for _, step, _ in got]
  if len(set(steps)) > 1:
    where = ", ".join(f"process {i}: {s}" for i, s in enumerate(steps))
    raise ValueError(f"the processes would start from different steps ({where}): each must "
                     "see the same workdir (on a file system every process shares) and its "
                     "checkpoints")
  bad = [i for i, (_, _, digest) in enumerate(got) if digest != got[0][2]]
  if bad:
    raise ValueError(f"the processes were started with different {what} (process(es) {bad} "
                     "differ from process 0): start every process with the same command and "
                     "files")
