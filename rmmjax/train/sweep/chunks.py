"""Configurations through one compiled jit(vmap(run)) in equal chunks (the last padded with
copies: nothing recompiles), each sharded over the devices; and the time a sweep takes."""

from __future__ import annotations

import time
from collections.abc import Iterator

import jax
import numpy as np
from jax.sharding import Mesh
from tqdm import tqdm

from rmmjax import distributed

# On a CPU a vmapped step streams the Adam state of every configuration in the chunk; two
# configurations keep it in cache and measured fastest (`rmmjax bench core`). An accelerator
# wants the widest program it can get.
CPU_CHUNK = 2


def chunk_size(setting: int, num_configs: int) -> int:
  """The configured chunk size, or the automatic choice for this platform when it is 0."""
  return setting or (CPU_CHUNK if jax.default_backend() == "cpu" else num_configs)


def _chunks(hparams_C, world, chunk_size: int, devices: list | None):
  """(C, each chunk's hparams as a thunk that places them, the world placed): every device gets
  the same share of a chunk."""
  devices = jax.devices() if devices is None else devices
  c = int(jax.tree.leaves(hparams_C)[0].shape[0])
  chunk, mesh = min(chunk_size, c), None
  if len(devices) > 1:
    mesh = Mesh(np.array(devices), (distributed.DATA_AXIS,))
    chunk, world = -(-chunk // len(devices)) * len(devices), distributed.replicate(world, mesh)
  index = np.minimum(np.arange(-(-c // chunk) * chunk), c - 1)

  def at(start: int):
    hp = jax.tree.map(lambda x: np.asarray(x)[index[start:start + chunk]], hparams_C)
    # (each process places the configurations its devices run)
    return hp if mesh is None else distributed.shard_leading(hp, mesh)

  return c, [lambda s=s: at(s) for s in range(0, len(index), chunk)], world


def run_chunks(run_chunk, hparams_C, world, chunk_size: int, devices: list | None = None,
               progress: bool = False, desc: str = "sweep chunks", first=None) -> dict:
  """Numpy results (C, ...) of C configurations (hparams_C's leading axis) in equal chunks;
  `first`: the first chunk's output, already computed (`time_first_chunk`'s)."""
  c, chunks, world = _chunks(hparams_C, world, chunk_size, devices)
  host = []
  with tqdm(total=len(chunks), desc=desc, unit="chunk", disable=not progress) as bar:
    pending = run_chunk(chunks[0](), world) if first is None else first
    for i in range(len(chunks)):
      # The next chunk is dispatched before this one is fetched: the device always has work
      # queued, and the bar moves as each chunk finishes (also where dispatch runs the chunk).
      following = run_chunk(chunks[i + 1](), world) if i + 1 < len(chunks) else None
      host.append(distributed.gather(pending))
      bar.update(1)
      pending = following
  return jax.tree.map(lambda *xs: np.concatenate(xs)[:c], *host)


def time_first_chunk(program, hparams_C, world, chunk_size: int, devices: list) -> dict:
  """The first chunk compiled and run, timed, placed as run_chunks places it: its compiled
  program and output serve the run after (nothing is computed twice)."""
  _, chunks, world = _chunks(hparams_C, world, chunk_size, devices)
  first, start = chunks[0](), time.perf_counter()
  compiled = program.lower(first, world).compile()
  compiled_at = time.perf_counter()
  out = jax.block_until_ready(compiled(first, world))
  return {"compile_s": compiled_at - start, "run_s": time.perf_counter() - compiled_at,
          "compiled": compiled, "out": out}


def minutes(seconds: float) -> str:
  return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def time_left(what: str, done: int, total: int, spent_s: float) -> str:
  """The time spent after `done` of `total` parts, and the time left at their mean."""
  return (f"{what} done after {minutes(spent_s)}; about "
          f"{minutes(spent_s / done * (total - done))} left")


def each_timed(todo: list, report, what) -> Iterator:
  """The items of `todo`, reporting after each the time spent and left (`what(n, item)` names
  the n-th)."""
  started = time.perf_counter()
  for n, item in enumerate(todo):
    yield item
    report(time_left(what(n, item), n + 1, len(todo), time.perf_counter() - started))
