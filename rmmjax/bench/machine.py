"""The machine a benchmark ran on, named in its JSON and under its table: a speed ratio means
little without the CPU's vector extensions (the encoder's ratio to sentence-transformers moves
from 1.05 on a 2-core AVX2 host to 1.89 on an AVX-512 one) or the accelerator's kind and count."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import jax

# The vector extensions that change a CPU's float32 matmul speed, widest first.
EXTENSIONS = ("avx512f", "avx512_bf16", "amx_tile", "avx2", "fma", "sve", "neon", "asimd")


def _cpu() -> tuple[str, list[str]]:
  model, flags = platform.processor() or platform.machine(), set()
  try:
    info = Path("/proc/cpuinfo").read_text()
  except OSError:
    return model, []
  for line in info.splitlines():
    key, _, value = line.partition(":")
    key = key.strip().lower()
    if key in ("model name", "hardware", "cpu model") and value.strip():
      model = value.strip()
    elif key in ("flags", "features"):
      flags |= set(value.split())
  return model, [e for e in EXTENSIONS if e in flags]


def machine_info() -> dict:
  """CPU model, its vector extensions and core count; JAX's devices (kind, count, processes)."""
  model, extensions = _cpu()
  devices = jax.devices()
  return {"cpu": model, "cpu_extensions": extensions, "cpu_cores": os.cpu_count(),
          "platform": platform.platform(), "jax": jax.__version__,
          "backend": jax.default_backend(), "device_kind": devices[0].device_kind,
          "device_count": len(devices), "process_count": jax.process_count()}


def describe(info: dict) -> str:
  """One line: "Intel Xeon ... (avx512f, avx2, fma; 2 cores); 4 x cpu (cpu backend)"."""
  ext = ", ".join(info["cpu_extensions"]) or "no vector extensions listed"
  return (f"{info['cpu']} ({ext}; {info['cpu_cores']} cores); {info['device_count']} x "
          f"{info['device_kind']} ({info['backend']} backend, jax {info['jax']})")
