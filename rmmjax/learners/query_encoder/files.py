"""Tuned query encoders as a learner=query_encoder workdir (its newest readable checkpoint) or
the Hugging Face directory `rmmjax export` writes from one holds them, and what they trained on."""

from __future__ import annotations

import sys
from pathlib import Path

import jax

from rmmjax.encode.encoder import SentenceEncoder
from rmmjax.encode.export import save_encoder
from rmmjax.encode.protocol import encoder_identity
from rmmjax.encode.tuned import TunedQueryEncoder, encoder_state
from rmmjax.io.checkpoint import saved_steps
from rmmjax.io.outputs import check_export_dir
from rmmjax.io.trained import export_manifest, newest_state, read_record
from rmmjax.io.kinds import refuse_unless
from rmmjax.io.manifest import read_run_record
from rmmjax.io.workdir import read_config, write_run_record
from rmmjax.learners.query_encoder.fit import encoder_spec


def load_query_encoder(path: Path, encoder, flag: str = "--encoder") -> TunedQueryEncoder:
  """The tuned query encoder of a query_encoder training workdir, or of a directory that
  `rmmjax export` wrote from one; `encoder` is the base encoder that embeds the memories.
  `flag` names where the path was given (a flag, or a config key such as "query_encoder=")."""
  path = Path(path)
  if not path.is_dir():
    raise FileNotFoundError(f"{flag}{'' if flag.endswith('=') else ' '}{path}: expected a "
                            "query_encoder training workdir or an exported encoder directory")
  kind = refuse_unless(path, flag, ("query encoder", "query encoder export", "no manifest"),
                       expected=("a tuned query encoder: a learner=query_encoder workdir, a "
                                 "two-stage workdir's query_encoder/, or an export of either")
                       if flag.endswith("=") else None)
  if kind != "query encoder":  # a Hugging Face directory: an export, or a plain encoder
    tuned = SentenceEncoder(path)
    shapes = [jax.tree.map(lambda x: x.shape, p) for p in (tuned.params, encoder.params)]
    if shapes[0] != shapes[1]:
      raise ValueError(f"--encoder {path}: its weights have other shapes than the base encoder "
                       f"{encoder_identity(encoder)} that embedded the memories")
    return TunedQueryEncoder(encoder, tuned.params)
  cfg = read_config(path)
  base = read_record(path)["encoder"]
  if base != encoder_identity(encoder):
    raise ValueError(f"{path} tuned the encoder {base}, but the memories are embedded with "
                     f"{encoder_identity(encoder)}")
  saved = saved_steps(path / "checkpoints")
  if saved and saved[-1] < cfg.steps:
    print(f"NOTE: the query encoder {path} has trained {saved[-1]} of its {cfg.steps} steps "
          "(interrupted or still running): it is used as it stands", file=sys.stderr)
  return TunedQueryEncoder(encoder, latest_encoder_params(path, cfg, encoder,
                                                         "tuned query encoder"))


def latest_encoder_params(path: Path, cfg, encoder, what: str) -> dict:
  """The encoder parameters of a workdir's newest readable checkpoint (`what`: their name)."""
  return newest_state(path, encoder_state(encoder, encoder_spec(cfg), cfg.hparams()),
                      what)[1].params


def query_encoder_record(path: Path) -> dict:
  """What a tuned query encoder (a workdir, or a directory exported from one) trained on."""
  run = read_run_record(path)
  return run["record"] if run is not None and run["kind"] == "export" else read_record(path)


def export_run(workdir: Path, out: Path) -> str:
  """The tuned encoder of a query_encoder workdir (or a two-stage run's first stage) as the
  Hugging Face-format directory `out`, with the export's manifest; says what was written."""
  check_export_dir(out, f"{workdir} holds a query encoder, which exports as a directory")
  encoder = SentenceEncoder()
  tuned = load_query_encoder(workdir, encoder)
  manifest = export_manifest(workdir)
  role = ("embed questions and memories with this model (tune=both: re-embed the bank)"
          if manifest["record"].get("tune") == "both" else
          "embed questions with this model, memories with the base model that the "
          "manifest's record.encoder names")
  save_encoder(encoder, tuned.params, out, metadata={"identity": tuned.identity, "role": role})
  write_run_record(out, manifest)  # last: a folder without it is no export
  return (f"wrote {out}: a Hugging Face-format encoder for the questions (sentence-transformers "
          "loads it); the memories keep the base encoder's embeddings")
