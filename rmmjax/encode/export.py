"""Writes a (possibly fine-tuned) encoder as a Hugging Face / sentence-transformers directory
(docs/command-line.md, export): its modules (Transformer -> mean Pooling -> Normalize) are
exactly what `BertEncoder` computes."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path

import jax
import numpy as np
from safetensors.numpy import load_file, save_file

from rmmjax.encode.bert import param_at, weight_names
from rmmjax.encode.encoder import SentenceEncoder

EXPORT_RECORD = "rmmjax_export.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.txt")
MODULES = [
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    {"idx": 2, "name": "2", "path": "2_Normalize",
     "type": "sentence_transformers.models.Normalize"},
]
# Legacy pooling keys: read by every sentence-transformers version and by embedding servers.
POOLING_MODES = ("pooling_mode_cls_token", "pooling_mode_mean_tokens", "pooling_mode_max_tokens",
                 "pooling_mode_mean_sqrt_len_tokens")


def _hf_tensors(encoder: SentenceEncoder, params: dict) -> dict[str, np.ndarray]:
  """Every tensor of the source safetensors file, the encoder's weights replaced by `params`."""
  source = load_file(str(encoder.model_dir / "model.safetensors"))
  prefix = "bert." if any(k.startswith("bert.encoder.") for k in source) else ""
  tensors = dict(source)  # tensors the encoder does not use (pooler, position_ids) stay as-is
  for path, name, transposed in weight_names(encoder.cfg):
    value = np.asarray(jax.device_get(param_at(params, path)), np.float32)
    want = np.shape(param_at(encoder.params, path))
    if value.shape != want:
      raise ValueError(f"params {'/'.join(path)} has shape {value.shape}; expected {want}")
    if not np.all(np.isfinite(value)):
      raise ValueError(f"params {'/'.join(path)} holds {np.sum(~np.isfinite(value))} "
                       f"non-finite values; refusing to export")
    tensors[prefix + name] = np.ascontiguousarray(value.T if transposed else value)
  return tensors


def _header_metadata(record: dict) -> dict[str, str]:
  # safetensors header metadata holds strings only; "format": "pt" is what transformers expects.
  flat = {"format": "pt", "rmmjax_source": record["source"]}
  for key, value in record["metadata"].items():
    flat[key] = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
  return flat


def _is_mean_pooling(config: dict, dim: int) -> bool:
  if config.get("word_embedding_dimension", config.get("embedding_dimension")) != dim:
    return False
  if "pooling_mode" in config:
    return config["pooling_mode"] in ("mean", ["mean"])
  return config.get("pooling_mode_mean_tokens") is True and not any(
      config.get(k) for k in POOLING_MODES + ("pooling_mode_weightedmean_tokens",
                                              "pooling_mode_lasttoken")
      if k != "pooling_mode_mean_tokens")


def _modules_match(source: Path) -> bool:
  if not source.is_file():
    return False
  try:
    modules = json.loads(source.read_text())
    return [(m["path"], m["type"].rsplit(".", 1)[-1]) for m in modules] == [
        (m["path"], m["type"].rsplit(".", 1)[-1]) for m in MODULES]
  except (ValueError, KeyError, TypeError, AttributeError):  # not a modules list: write ours
    return False


def _read_json(path: Path) -> dict:
  try:
    data = json.loads(path.read_text())
  except ValueError:
    return {}
  return data if isinstance(data, dict) else {}


def _write_json(path: Path, data) -> None:
  path.write_text(json.dumps(data, indent=2) + "\n")


def _write_sentence_transformers_files(encoder: SentenceEncoder, src: Path, dst: Path) -> None:
  """Module files copied from the source when they describe what the encoder computes (BERT ->
  mean pooling -> L2 normalisation), else written to say so."""
  if _modules_match(src / "modules.json"):
    shutil.copyfile(src / "modules.json", dst / "modules.json")
  else:
    _write_json(dst / "modules.json", MODULES)
  (dst / "1_Pooling").mkdir()
  pooling = src / "1_Pooling" / "config.json"
  if pooling.is_file() and _is_mean_pooling(_read_json(pooling), encoder.dim):
    shutil.copyfile(pooling, dst / "1_Pooling" / "config.json")
  else:
    _write_json(dst / "1_Pooling" / "config.json",
                {"word_embedding_dimension": encoder.dim,
                 **{k: k == "pooling_mode_mean_tokens" for k in POOLING_MODES}})
  (dst / "2_Normalize").mkdir()  # Normalize has no weights; its defaults are the L2 norm
  # Written when the source has none: the length SentenceEncoder truncates to (so both readers
  # cut texts alike), and sentence-transformers' own defaults.
  for name, default in (
      ("sentence_bert_config.json", {"max_seq_length": encoder.max_length,
                                     "do_lower_case": False}),
      ("config_sentence_transformers.json", {"model_type": "SentenceTransformer", "prompts": {},
                                             "default_prompt_name": None,
                                             "similarity_fn_name": "cosine"})):
    if (src / name).is_file():
      shutil.copyfile(src / name, dst / name)
    else:
      _write_json(dst / name, default)


def _check_out_dir(out_dir: Path) -> None:
  if out_dir.is_file():
    raise ValueError(f"export path {out_dir} is a file; expected a directory to write")
  if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / EXPORT_RECORD).is_file():
    raise ValueError(f"export directory {out_dir} is not empty and holds no {EXPORT_RECORD}: "
                     f"refusing to replace something that is not a previous export")


def _remove_stale(out_dir: Path) -> None:
  """Removes what an export killed before its rename left beside out_dir: folders of a process
  that is gone (a live one may be exporting there right now)."""
  for stale in [*out_dir.parent.glob(f".{out_dir.name}.partial-*"),
                *out_dir.parent.glob(f".{out_dir.name}.old-*")]:
    pid = stale.name.rsplit(".partial-", 1)[-1].split("-", 1)[0]
    if ".partial-" in stale.name and pid.isdigit() and _alive(int(pid)):
      continue
    shutil.rmtree(stale, ignore_errors=True)


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # someone else's process: alive
    return True
  return True


def save_encoder(encoder: SentenceEncoder, params: dict | None, out_dir: str | Path, *,
                 metadata: dict | None = None) -> Path:
  """Writes `encoder` with `params` (its own when None) to `out_dir`, atomically, replacing only
  an empty folder or a previous export; returns it. `metadata` (JSON values) goes into
  rmmjax_export.json and, as strings, into the safetensors header."""
  out_dir = Path(out_dir)
  metadata = dict(metadata or {})
  _check_out_dir(out_dir)
  src = encoder.model_dir
  tensors = _hf_tensors(encoder, encoder.params if params is None else params)
  record = {"source": encoder.identity, "source_dir": str(src.resolve()),
            "params": "as loaded" if params is None else "given", "metadata": metadata}

  out_dir.parent.mkdir(parents=True, exist_ok=True)
  _remove_stale(out_dir)
  tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-{os.getpid()}-",
                              dir=out_dir.parent))
  try:
    shutil.copyfile(src / "config.json", tmp / "config.json")
    for name in TOKENIZER_FILES:
      if (src / name).is_file():
        shutil.copyfile(src / name, tmp / name)
    _write_sentence_transformers_files(encoder, src, tmp)
    save_file(tensors, str(tmp / "model.safetensors"), metadata=_header_metadata(record))
    _write_json(tmp / EXPORT_RECORD, record)
    # mkdtemp and save_file create private entries; give them the mode copied files got.
    mode = (tmp / "config.json").stat().st_mode & 0o777
    os.chmod(tmp / "model.safetensors", mode)
    os.chmod(tmp, mode | (mode & 0o444) >> 2)
    _check_out_dir(out_dir)  # again: something may have appeared while this one was written
    old = None
    if out_dir.is_dir() and any(out_dir.iterdir()):
      old = out_dir.parent / f".{out_dir.name}.old-{uuid.uuid4().hex[:8]}"
      out_dir.rename(old)
    try:
      os.replace(tmp, out_dir)  # replaces an empty directory too
    except OSError:
      if old is not None:
        old.rename(out_dir)
      raise
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  if old is not None:
    shutil.rmtree(old, ignore_errors=True)
  return out_dir
