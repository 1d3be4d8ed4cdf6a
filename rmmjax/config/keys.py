"""How `--set` names a key of a config: a shared key by its name, a learner's as section.key or
by its name alone (the run's own learner first); parsing and setting values by those names."""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import math
from typing import Any

from rmmjax.learners import sections


def names(section) -> tuple[str, ...]:
  """The keys of a section (a class or an instance)."""
  return tuple(f.name for f in dataclasses.fields(section))


def shared_keys(cfg) -> set[str]:
  """The keys of a config (its class or an instance) outside the sections."""
  return set(names(cfg)) - set(sections.SECTIONS)


def _locate(cfg, key: str) -> tuple[str | None, str]:
  """(section or None, field) of a key as `--set` names it: `section.key`, a shared key, or a
  key of the run's sections by its name alone (the run's own learner first, so under
  learner=query_encoder,cross `lr` is the reranker's and `encoder_tuning.lr` the encoder's)."""
  section, dot, name = key.partition(".") if "." in key else ("", "", key)
  if dot:
    if not section or not name or "." in name:
      raise ValueError(f"config key {key!r}: expected KEY or SECTION.KEY")
    if section not in sections.SECTIONS:
      raise ValueError(f"unknown config section {section!r} in {key!r}"
                       f"{_did_you_mean(section, sections.SECTIONS)}; sections: "
                       f"{', '.join(sections.SECTIONS)}")
    if getattr(cfg, section) is None:
      raise ValueError(f"unknown config key {key!r}: this run ({trains(cfg)}) has no "
                       f"{section} section; its sections: {', '.join(cfg.section_names())}")
    if name not in names(sections.SECTIONS[section]):
      keys = names(sections.SECTIONS[section])
      raise ValueError(f"unknown config key {key!r}{_did_you_mean(name, keys, section + '.')}; "
                       f"the {section} section's keys: {', '.join(keys)}")
    return section, name
  if name in shared_keys(cfg):
    return None, name
  for section in reversed(cfg.section_names()):
    if name in names(getattr(cfg, section)):
      return section, name
  owners = [s for s, kind in sections.SECTIONS.items() if name in names(kind)]
  if owners:
    raise ValueError(f"unknown config key {name!r} for this run ({trains(cfg)}): it belongs to "
                     f"the {' and '.join(owners)} section{'s' if len(owners) > 1 else ''}; this "
                     f"run's sections: {', '.join(cfg.section_names())}")
  known = sorted(set(cfg.values()) | {k.split(".")[1] for k in cfg.values() if "." in k})
  # (variant, the key of earlier versions: the one learner key names a family)
  hint = (": name the reranker family as the learner (learner=cross, or "
          "learner=query_encoder,cross over a tuned query encoder)" if key == "variant" else
          f"{_did_you_mean(key, known)}; known keys: {', '.join(known)}")
  raise ValueError(f"unknown config key {key!r}{hint}")


def _did_you_mean(name: str, known, prefix: str = "") -> str:
  close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.65)
  return f" (did you mean {prefix + close[0]!r}?)" if close else ""


def qualified(cfg, key: str) -> str:
  """A key as config.json names it (`section.key`, or a shared key alone)."""
  return ".".join(filter(None, _locate(cfg, key)))


def trains(cfg) -> str:
  return f"config={cfg.config}, learner={cfg.learner}" + (
      f", units={cfg.units}" if cfg.units == "lace" else "")


def parse_value(key: str, text: str, cfg) -> Any:
  """Parses `text` as the type of key `key` of cfg, naming both on failure."""
  default = get_value(cfg, key)
  with contextlib.suppress(ValueError):
    if isinstance(default, bool):
      if text.lower() in ("true", "false", "1", "0"):
        return text.lower() in ("true", "1")
    elif isinstance(default, int):
      return int(text)
    elif isinstance(default, float):
      if math.isfinite(value := float(text)):
        return value
    else:
      return text
  raise ValueError(f"{key}={text!r}: expected {_KIND[type(default)]}")


_KIND = {bool: "true or false", int: "an integer", float: "a finite number", str: "text"}


def check_type(key: str, value: Any, default: Any) -> None:
  """Refuses a value read from a file (config.json) whose type is not its key's."""
  kind = type(default)
  if (type(value) is not kind and not (kind is float and type(value) is int)) or (
      kind is float and value != value):
    raise ValueError(f"{key}={value!r}: expected {_KIND[kind]}")


def get_value(cfg, key: str) -> Any:
  """The value of a key as `--set` names it."""
  section, name = _locate(cfg, key)
  return getattr(getattr(cfg, section) if section else cfg, name)


def with_values(cfg, changes: dict[str, Any]) -> Any:
  """cfg with keys (as `--set` names them) set to parsed values. The shared keys go first,
  since they decide which sections the run has."""
  shared = {k: v for k, v in changes.items() if k in shared_keys(cfg)}
  cfg = dataclasses.replace(cfg, **shared)
  by_section: dict[str, dict] = {}
  for key, value in changes.items():
    if key not in shared_keys(cfg):
      section, name = _locate(cfg, key)
      by_section.setdefault(section, {})[name] = value
  return dataclasses.replace(cfg, **{s: dataclasses.replace(getattr(cfg, s), **v)
                                     for s, v in by_section.items()})


def apply_overrides(cfg, overrides: list[str]) -> Any:
  """Applies `key=value` strings to cfg (a later one of the same key wins)."""
  texts = {}
  for item in overrides:
    if "=" not in item:
      raise ValueError(f"override {item!r}: expected key=value")
    key, text = item.split("=", 1)
    if key.strip() == "config":
      raise ValueError(f"override {item!r}: the named config is chosen by --config")
    texts[key.strip()] = text.strip()
  shared = {k: parse_value(k, t, cfg) for k, t in texts.items() if k in shared_keys(cfg)}
  cfg = dataclasses.replace(cfg, **shared)
  return with_values(cfg, {k: parse_value(k, t, cfg) for k, t in texts.items()
                           if k not in shared_keys(cfg)})
