"""A run's working directory: its lock, its config.json, and files written whole or not at all;
its manifest (io/manifest.py) says whether it holds a "train" run or a "sweep"."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

from rmmjax.config import Config, from_json, qualified
from rmmjax.learners import sections
from rmmjax.io.manifest import (FORMAT, RECORD_FILE, RUN_FILE, read_run_record,
                                 stopped_in_first_stage)
from rmmjax.io.record import file_sha256

LOCK_FILE = ".lock"  # names the one process that holds the workdir (the lock is on the folder)


class FolderLock:
  """An exclusive flock on a folder itself (its open handle), held until `close()` or the
  process's end, SIGKILL included. Locking the folder rather than a file in it means that no
  file deleted or replaced inside it lets a second holder in."""

  def __init__(self, fd: int, folder: Path):
    self._fd, self.folder = fd, Path(folder)

  def at_path(self) -> bool:
    return self._fd is not None and _is_at(self._fd, self.folder)

  def check(self) -> None:
    """Refuses to go on writing when the locked folder is no longer the one at its path
    (removed, or removed and made again by another process, which then holds that one)."""
    if self._fd is not None and not _is_at(self._fd, self.folder):
      raise ValueError(f"{self.folder} was removed or replaced while this run held it: stopped "
                       "without writing more; train into a folder no one deletes")

  def close(self) -> None:
    if self._fd is not None:
      os.close(self._fd)
      self._fd = None


def take_lock(folder: Path, holder: str) -> tuple[FolderLock | None, str]:
  """(the lock on `folder`, made if missing, with `holder` written to folder/.lock for whoever
  is refused next); or (None, the holder's words) when another process holds it. Between
  opening and locking, the folder may be removed and made again (a refused run cleans up), so
  the lock is kept only once its folder is the one at the path (same device and inode)."""
  folder = Path(folder)
  for _ in range(100):
    folder.mkdir(parents=True, exist_ok=True)
    try:
      fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:  # removed since it was made: made again
      continue
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      os.close(fd)
      return None, _holder(folder)
    if _is_at(fd, folder):
      with contextlib.suppress(OSError):  # the words are a courtesy; the lock is the folder's
        (folder / LOCK_FILE).write_text(holder)
      return FolderLock(fd, folder), holder
    os.close(fd)  # a folder removed (or replaced) since it was opened: the path's, again
  raise ValueError(f"{folder} was removed as often as it was made (100 times): is another "
                   "program deleting it?")


def _holder(folder: Path) -> str:
  """The words the process holding `folder` wrote in its lock file ("" when unreadable)."""
  try:
    return (folder / LOCK_FILE).read_text().strip()
  except (OSError, UnicodeDecodeError):
    return ""


def _is_at(fd: int, folder: Path) -> bool:
  """Whether the open folder `fd` is the one now at `folder`."""
  try:
    at = os.stat(folder)
  except FileNotFoundError:
    return False
  mine = os.fstat(fd)
  return (mine.st_dev, mine.st_ino) == (at.st_dev, at.st_ino)


@contextlib.contextmanager
def held(workdir: Path, command: str) -> Iterator[FolderLock]:
  """Holds `workdir` for this process while the block runs: a second `train` or `sweep` into it
  is refused naming the holder. A block that leaves nothing but the lock (a refused run) leaves
  no trace: the lock file goes, and so do the folders it created."""
  workdir = Path(workdir)
  if workdir.exists() and not workdir.is_dir():
    raise ValueError(f"{workdir} is a file; expected a directory")
  if workdir.is_symlink() and not workdir.exists():
    raise ValueError(f"{workdir} is a link to {os.readlink(workdir)}, which does not exist; "
                     "make that directory or give another workdir")
  created = [p for p in [workdir, *workdir.parents] if not p.exists()]
  lock, holder = take_lock(workdir, f"rmmjax {command} (pid {os.getpid()} on "
                                    f"{socket.gethostname()})")
  if lock is None:
    raise ValueError(f"{workdir} is in use by {holder or 'another process'}: one process at a "
                     "time trains or sweeps into a workdir; wait for it to end, or use another "
                     "workdir")
  try:
    yield lock
  finally:
    # Removed while still held: a process that opened the folder before and locks it after
    # finds it is no longer the one at the path (take_lock), and takes the path's instead.
    # Only the folder this process locked: one removed under it and made again at the path is
    # another process's.
    with contextlib.suppress(OSError):
      if lock.at_path() and {p.name for p in workdir.iterdir()} <= {LOCK_FILE}:
        (workdir / LOCK_FILE).unlink(missing_ok=True)
        for folder in created:  # the innermost first, while empty (another may hold a parent)
          folder.rmdir()
    lock.close()


def refuse_if_training(*flags: tuple[str, str | None]) -> None:
  """Refuses each (flag, path) given that names a workdir another process is still writing: its
  checkpoints are saved and pruned as it runs, so what is read may vanish half-way."""
  for flag, path in ((flag, Path(path)) for flag, path in flags if path):
    if not path.is_dir():
      continue
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
      fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # (only a holder's exclusive lock refuses)
    except BlockingIOError:
      raise ValueError(f"{flag} {path} is being trained by {_holder(path) or 'another process'} "
                       "(its checkpoints change as it runs): use it when that run ends") from None
    finally:
      os.close(fd)


def _umask() -> int:
  """The process umask, read without changing it where possible (threads may be creating files)."""
  with contextlib.suppress(OSError, ValueError):
    for line in Path("/proc/self/status").read_text().splitlines():
      if line.startswith("Umask:"):
        return int(line.split()[1], 8)
  mask = os.umask(0o022)
  os.umask(mask)
  return mask


def default_mode(directory: bool = False) -> int:
  """The permissions open() or mkdir() would give a new file or directory."""
  return (0o777 if directory else 0o666) & ~_umask()


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
  """Yields a temporary file name beside path, which replaces path when the block ends: readers
  never see half a file, and a failed block leaves path as it was."""
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
  os.close(fd)
  try:
    yield Path(tmp)
    os.chmod(tmp, default_mode())  # mkstemp makes 0600; the file should be like any other output
    os.replace(tmp, path)
  except BaseException:
    Path(tmp).unlink(missing_ok=True)
    raise


def atomic_write_text(path: Path, text: str) -> None:
  with atomic_path(path) as tmp:
    tmp.write_text(text)


def atomic_write_json(path: Path, data) -> None:
  atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


@contextlib.contextmanager
def replace_dir(path: Path) -> Iterator[Path]:
  """Yields an empty temporary directory beside path that replaces path when the block ends. A
  kill between the two renames leaves the old one as .NAME.*.old, which the next one removes."""
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  for stale in [*path.parent.glob(f".{path.name}.*.tmp"), *path.parent.glob(f".{path.name}.*.old")]:
    shutil.rmtree(stale, ignore_errors=True)
  tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
  try:
    os.chmod(tmp, default_mode(directory=True))  # mkdtemp makes 0700
    yield tmp
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  old = None
  if path.exists():
    old = path.with_name(f".{path.name}.{os.getpid()}.old")
    os.replace(path, old)
  os.replace(tmp, path)
  if old is not None:
    shutil.rmtree(old, ignore_errors=True)


def write_run_record(workdir: Path, record: dict) -> None:
  atomic_write_json(Path(workdir) / RUN_FILE, {"format": FORMAT} | record)


def read_config(workdir: Path) -> Config:
  """The config of a training workdir (a sweep's workdir is refused: it has no trained model)."""
  record = read_run_record(workdir)
  if record is not None and record["kind"] == "sweep":
    best = Path(workdir) / "best"
    raise ValueError(f"{workdir} holds a sweep, not a training run (its config.json is the "
                     "sweep's base config and it has no checkpoints); " + (
                         f"its best configuration, trained on every conversation, is {best}"
                         if best.is_dir() else "it ran with --no-best, so it trained no model "
                         "on every conversation: train one with its best row's settings"))
  path = Path(workdir) / "config.json"
  if not path.exists():
    raise stopped_in_first_stage(workdir) or FileNotFoundError(
        f"{path} does not exist: is {workdir} a training workdir?")
  return read_config_file(path)


def read_config_file(path: Path) -> Config:
  """The config in a run's config.json; a damaged one (or another version's) is refused."""
  try:
    return from_json(path.read_text())
  except (OSError, ValueError, TypeError) as err:
    raise ValueError(f"{path} is not a readable rmmjax config ({err}); use a fresh workdir, "
                     "or restore the file") from None


def _config_diff(path: Path, cfg: Config, ignore: tuple[str, ...] = ()) -> dict:
  """The keys (as config.json names them) on which the config at `path` and cfg differ."""
  old = read_config_file(path).values()
  new = cfg.values()
  return {k: (old.get(k), new.get(k)) for k in sorted(set(old) | set(new))
          if old.get(k) != new.get(k) and k not in ignore}


def _shown(diff: dict) -> str:
  return ", ".join(f"{k}: {a!r} there, {b!r} now" for k, (a, b) in diff.items())


def _same_data(workdir: Path, data: str) -> bool:
  """Whether a run's data file, wherever it is now, has the content the run started on."""
  path = Path(workdir) / RECORD_FILE
  if not data or not path.is_file():
    return False
  try:
    old = json.loads(path.read_text()).get("data_sha256")
  except (OSError, ValueError, AttributeError):
    return False  # (a damaged record is refused where it is read)
  return old is not None and Path(data).is_file() and old == file_sha256(Path(data))


def check_resumable(workdir: Path, cfg: Config, stage: bool = False) -> None:
  """Refuses a sweep's workdir, one that holds a run of another config, or (unless `stage`: the
  run trains it as its own first stage) the first stage of a two-stage run trained alone; before
  anything is written. The data file may have moved or been copied: its content is compared."""
  record = read_run_record(workdir)
  if record is not None and record["kind"] == "sweep":
    raise ValueError(f"{workdir} holds a sweep, not a training run; train into a fresh workdir")
  # (a first stage trains in the folder named by its learner, inside its run's workdir)
  first = (not stage and cfg.learner == sections.FIRST_STAGE
           and Path(workdir).name == cfg.learner)
  parent = read_run_record(Path(workdir).resolve().parent) if first else None
  if parent is not None and parent["kind"] == "train":
    raise ValueError(f"{workdir} is the first stage of the learner={parent['learner']} run in "
                     f"{Path(workdir).resolve().parent}: training it alone would change what "
                     "that run's reranker trained on; resume the run itself, or train into "
                     "another workdir")
  path = Path(workdir) / "config.json"
  if not path.exists():
    if (Path(workdir) / "checkpoints").exists():
      raise ValueError(f"{workdir} holds checkpoints but no config.json; use a fresh workdir")
    return
  # A resume may extend the last learner's steps (an earlier stage's would change what the
  # later ones trained on) and change the devices (the same state, re-placed).
  extendable = (f"{cfg.learning.NAME}.steps", "devices") + (
      ("data",) if _same_data(workdir, cfg.data) else ())
  diff = _config_diff(path, cfg, extendable)
  if diff:
    raise ValueError(f"{workdir} holds a run of another config ({_shown(diff)}); use a fresh "
                     "workdir or the same settings to resume"
                     + (f" (of the steps, only {cfg.learning.NAME}.steps extends a run: an "
                        "earlier stage's would change what the later ones trained on)"
                        if any(k.endswith(".steps") for k in diff) else ""))


def sweep_record(grid: dict[str, list], seeds: int, folds: int = 0,
                 data_sha256: str | None = None) -> dict:
  """What the manifest says of a sweep: its grid as JSON reads it back (for comparisons); over
  replayed conversations also the grid's order (its folds are saved by configuration number)."""
  return {"kind": "sweep", "grid": json.loads(json.dumps(grid)), "seeds": seeds} | (
      {"folds": folds, "data_sha256": data_sha256, "grid_order": list(grid)} if folds else {})


def in_recorded_order(workdir: Path, cfg: Config, grid: dict[str, list]) -> dict[str, list]:
  """`grid` in the order of the sweep recorded in `workdir` where it is the same grid listed in
  another order (runs are numbered in that order, so the same sweep resumes); else `grid`."""
  record = read_run_record(workdir)
  if not record or record.get("kind") != "sweep" or not isinstance(record.get("grid"), dict):
    return grid
  try:
    mine = {qualified(cfg, k): k for k in grid}
    recorded = {qualified(cfg, k): v for k, v in record["grid"].items()}
    # (the manifest's grid is written with its keys sorted; grid_order keeps a replay sweep's)
    order = [qualified(cfg, k) for k in record.get("grid_order") or grid]
  except ValueError:  # (a recorded key this run cannot name: another sweep)
    return grid
  if (len(mine) != len(grid) or set(order) != set(mine) or not set(order) <= set(recorded)
      or any(sorted(map(repr, recorded[n])) != sorted(map(repr, grid[mine[n]])) for n in order)):
    return grid
  return {mine[n]: recorded[n] for n in order}


def check_sweepable(workdir: Path, cfg: Config, grid: dict[str, list], seeds: int,
                    folds: int = 0, data_sha256: str | None = None) -> None:
  """Refuses a training workdir, or a sweep of another grid, seeds, config or data (by content)."""
  record = read_run_record(workdir)
  if record is None:
    return
  if record["kind"] == "train":
    raise ValueError(f"{workdir} holds a training run; a sweep needs a fresh workdir (it would "
                     "overwrite the run's config and outputs)")
  if record.get("data_sha256") and record["data_sha256"] != data_sha256:
    raise ValueError(f"{workdir} holds a sweep over other data: {cfg.data} is not the file its "
                     "folds were computed on (its content differs); use a fresh workdir")
  new = sweep_record(grid, seeds, folds, data_sha256)
  # A key spelled plainly or with its section is the same key.
  def named(key: str) -> str:  # (a recorded key this run cannot name differs anyway)
    with contextlib.suppress(ValueError):
      return qualified(cfg, key)
    return key
  spelled = {"grid": lambda g: {named(k): v for k, v in g.items()},
             "grid_order": lambda keys: [named(k) for k in keys]}
  same = lambda k, v: spelled[k](v) if k in spelled and v is not None else v  # noqa: E731
  diff = {k: (record.get(k), new.get(k)) for k in ("grid", "seeds", "folds", "grid_order")
          if same(k, record.get(k)) != same(k, new.get(k))}
  path = Path(workdir) / "config.json"
  if path.exists():
    # Every configuration sets the grid's keys: the base config's values of them are not used.
    swept = {qualified(cfg, key) for key in grid}
    diff.update({k: v for k, v in _config_diff(path, cfg, ignore=("data",) if data_sha256
                                               else ()).items() if k not in swept})
  if diff:
    raise ValueError(f"{workdir} holds a sweep of another grid, seeds or config ({_shown(diff)});"
                     " use a fresh workdir, or the same settings to redo it")
