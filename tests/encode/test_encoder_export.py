"""Exporting the encoder as a Hugging Face / sentence-transformers directory, with tuned weights."""

import json
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from rmmjax.encode.encoder import REQUIRED_FILES, SentenceEncoder
from rmmjax.encode.export import EXPORT_RECORD, save_encoder

TEXTS = [
    "Hey Mel! Good to see you! How have you been?",
    "I went to an LGBTQ support group yesterday and it was so powerful.",
    "Wow, that sounds amazing. What happened there?",
    "The transgender stories were so inspiring!",
    "I painted that lake sunrise last year; it's special to me.",
    "Thanks, Caroline! Painting is a fun way to express my feelings.",
    "We took the kids camping at the beach last weekend.",
    "My daughter's birthday party is next Saturday, are you coming?",
    "I'm thinking of going into counseling or mental health work.",
    "That's a big decision. What made you choose that path?",
    "Honestly, the support I got when I was struggling.",
    "Did you finish the book I lent you?",
    "Yes! The ending made me cry on the train home.",
    "I started pottery classes, my first bowl was a disaster.",
    "Ha, the first one always is. Keep going!",
    "We adopted a puppy named Oliver from the shelter.",
    "He chewed through two pairs of my running shoes already.",
    "Our family road trip to the Grand Canyon was unforgettable.",
    "I ran a charity 5K for the children's hospital in May.",
    "Music festivals are my favourite part of summer.",
    "Can you recommend a good violin teacher for my son?",
    "I've been volunteering at the youth center on Tuesdays.",
    "The mentorship program matched me with a teenager who loves art.",
    "Sorry I missed your call, work has been hectic this week.",
    "No worries! Let's catch up over coffee on Friday.",
    "My grandma gave me this necklace before she passed away.",
    "I keep it with me as a reminder of her love.",
    "Did the adoption agency get back to you yet?",
    "Not yet, but the interview went really well.",
    "I'm so proud of you for taking that step.",
    "We went hiking in the mountains and saw a bear!",
    "Stay safe out there and tell me all about it later.",
    "ok",
    "Yes.",
    "What time does the pride parade start tomorrow morning?",
    "I wrote a poem about finding my identity and read it at the open mic night.",
]


@pytest.fixture(scope="module")
def encoder():
  return SentenceEncoder(batch_size=64)


@pytest.fixture(scope="module")
def perturbed(encoder):
  """The loaded weights moved by 1% of each tensor's spread: an export cannot just copy files."""
  leaves, tree = jax.tree.flatten(encoder.params)
  rng = np.random.default_rng(0)
  moved = [np.asarray(x) + 0.01 * float(np.std(x)) * rng.standard_normal(x.shape, np.float32)
           for x in leaves]
  return jax.tree.unflatten(tree, [jnp.asarray(x) for x in moved])


@pytest.fixture(scope="module")
def exported(encoder, perturbed, tmp_path_factory):
  out = tmp_path_factory.mktemp("export") / "tuned"
  meta = {"trained_on": "locomo_dev8 questions", "epochs": 2}
  assert save_encoder(encoder, perturbed, out, metadata=meta) == out
  return out


def _sentence_transformers():
  try:
    import sentence_transformers  # noqa: PLC0415
  except ImportError:
    if os.environ.get("CI"):
      raise
    pytest.skip("the comparison needs sentence-transformers and torch: pip install -e '.[parity]'")
  return sentence_transformers


def test_sentence_transformers_loads_the_export_with_the_tuned_embeddings(
    encoder, perturbed, exported):
  st = _sentence_transformers()
  original = encoder.encode(TEXTS)
  in_memory = encoder.encode(TEXTS, params=perturbed)
  assert np.sum(original * in_memory, axis=1).min() < 0.9995  # the perturbation is visible
  reference = st.SentenceTransformer(str(exported), device="cpu")
  theirs = reference.encode(TEXTS, batch_size=64)
  reloaded = SentenceEncoder(exported, batch_size=64).encode(TEXTS)
  for ours in (in_memory, reloaded):
    cosine = np.sum(ours * theirs, axis=1) / np.linalg.norm(theirs, axis=1)
    assert cosine.min() >= 0.9999, (cosine.min(), TEXTS[int(cosine.argmin())])
  # SentenceEncoder re-reads its own export to rounding.
  np.testing.assert_allclose(reloaded, in_memory, atol=1e-5)


def test_metadata_in_the_record_and_the_safetensors_header(exported):
  record = json.loads((exported / EXPORT_RECORD).read_text())
  assert record["metadata"] == {"trained_on": "locomo_dev8 questions", "epochs": 2}
  assert record["params"] == "given"
  with safe_open(str(exported / "model.safetensors"), "np") as f:
    header = f.metadata()
  assert header["format"] == "pt" and header["trained_on"] == "locomo_dev8 questions"
  assert header["epochs"] == "2"
  modules = json.loads((exported / "modules.json").read_text())
  assert [m["type"].rsplit(".", 1)[-1] for m in modules] == ["Transformer", "Pooling",
                                                            "Normalize"]
  pooling = json.loads((exported / "1_Pooling" / "config.json").read_text())
  assert pooling["pooling_mode_mean_tokens"] and not pooling["pooling_mode_cls_token"]
  assert not list(exported.parent.glob(".*")), "a temporary directory was left behind"


def test_unchanged_round_trip_reproduces_the_source_tensors(encoder, tmp_path):
  out = save_encoder(encoder, None, tmp_path / "same")
  source = load_file(str(encoder.model_dir / "model.safetensors"))
  written = load_file(str(out / "model.safetensors"))
  assert sorted(written) == sorted(source)
  for name, value in source.items():
    assert written[name].dtype == value.dtype, name
    np.testing.assert_array_equal(written[name], value, err_msg=name)
  for name in ("config.json", "tokenizer.json", "vocab.txt"):
    assert (out / name).read_bytes() == (encoder.model_dir / name).read_bytes()


def test_what_a_killed_export_left_is_removed_by_the_next(encoder, tmp_path):
  dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                        capture_output=True, text=True, check=True).stdout.strip()
  leftovers = [tmp_path / f".out.partial-{dead}-x1", tmp_path / ".out.partial-olderform",
               tmp_path / ".out.old-1234abcd"]
  live = tmp_path / f".out.partial-{os.getpid()}-busy"  # another export, still running
  for folder in [*leftovers, live]:
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"half")
  save_encoder(encoder, None, tmp_path / "out")
  assert not any(folder.exists() for folder in leftovers) and live.is_dir()
  assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, "out"])


def test_non_finite_params_are_refused_before_anything_is_written(encoder, tmp_path):
  bad = jax.tree.map(lambda x: x, encoder.params)
  bad["layer_3"]["value"]["kernel"] = bad["layer_3"]["value"]["kernel"].at[0, 5].set(jnp.nan)
  with pytest.raises(ValueError, match="layer_3/value/kernel holds 1 non-finite"):
    save_encoder(encoder, bad, tmp_path / "nan")
  assert list(tmp_path.iterdir()) == []


def test_refuses_to_overwrite_what_is_not_a_previous_export(encoder, exported, tmp_path):
  taken = tmp_path / "taken"
  taken.mkdir()
  (taken / "notes.txt").write_text("keep me")
  with pytest.raises(ValueError, match="not empty and holds no rmmjax_export.json"):
    save_encoder(encoder, None, taken)
  assert [p.name for p in taken.iterdir()] == ["notes.txt"]
  (tmp_path / "file").write_text("x")
  with pytest.raises(ValueError, match="is a file"):
    save_encoder(encoder, None, tmp_path / "file")
  # A previous export is replaced as a whole; an empty directory is filled.
  again = save_encoder(encoder, None, tmp_path / "again", metadata={"round": 1})
  save_encoder(encoder, None, again, metadata={"round": 2})
  assert json.loads((again / EXPORT_RECORD).read_text())["metadata"] == {"round": 2}
  (tmp_path / "empty").mkdir()
  assert (save_encoder(encoder, None, tmp_path / "empty") / "model.safetensors").is_file()
  assert sorted(p.name for p in tmp_path.iterdir()) == ["again", "empty", "file", "taken"]


@pytest.mark.parametrize("missing", REQUIRED_FILES)
def test_a_model_dir_missing_a_required_file_is_refused_by_name(exported, tmp_path, missing):
  partial = tmp_path / "partial"
  partial.mkdir()
  for entry in exported.iterdir():
    if entry.name != missing:
      (partial / entry.name).symlink_to(entry)
  with pytest.raises(FileNotFoundError, match=f"{missing} not found"):
    SentenceEncoder(partial)


def test_a_bare_hugging_face_dir_gets_the_sentence_transformers_files(encoder, tmp_path):
  # Weights saved from BertForMaskedLM-style code carry a "bert." prefix and no module files.
  src = tmp_path / "bare"
  src.mkdir()
  for name in ("config.json", "tokenizer.json", "vocab.txt"):
    shutil.copyfile(encoder.model_dir / name, src / name)
  weights = load_file(str(encoder.model_dir / "model.safetensors"))
  save_file({k if k.startswith("pooler.") else "bert." + k: v for k, v in weights.items()},
            str(src / "model.safetensors"), metadata={"format": "pt"})
  out = save_encoder(SentenceEncoder(src), None, tmp_path / "out")
  written = load_file(str(out / "model.safetensors"))
  assert "bert.encoder.layer.0.attention.self.query.weight" in written
  assert json.loads((out / "sentence_bert_config.json").read_text())["max_seq_length"] == 512
  st = _sentence_transformers()
  theirs = st.SentenceTransformer(str(out), device="cpu").encode(TEXTS, batch_size=64)
  assert np.sum(encoder.encode(TEXTS) * theirs, axis=1).min() >= 0.9999
