#!/usr/bin/env bash
# One prepared check of rmmjax on an accelerator (at most about 20 minutes): the parity tests
# at precision=highest (fast scorer = naive formula, export = JAX to 1e-5, encoder =
# sentence-transformers, the cross reranker's core), `rmmjax bench core`, `bench encode`,
# `bench cross` and `bench scaling`, one `train --config locomo` and a short cross-reranker run
# in bfloat16; every number is written under OUT with the device named.
#
#   pip install -e '.[parity]' && pip install -U "jax[cuda12]"   # or "jax[tpu]" on a TPU VM
#   OUT=results/accelerator DATA=../shared/data/locomo/locomo_dev8.json \
#     bash experiments/accelerator_check.sh
set -euo pipefail
OUT=${OUT:-accelerator_check}
DATA=${DATA:-../shared/data/locomo/locomo_dev8.json}
mkdir -p "$OUT"
# On an accelerator compiles are most of a run's time (docs/benchmarks.md): every program is
# kept, so the runs below, and this script run again, load what an earlier one compiled.
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$HOME/.cache/rmmjax/jax}
python - <<'EOF' | tee "$OUT/device.txt"
import jax
from rmmjax.bench.machine import describe, machine_info
info = machine_info()
print(describe(info))
if info["backend"] == "cpu":
  print("warning: JAX sees no accelerator here; the numbers below are the CPU's")
EOF
# The parity tests (they compare against independent computations at full float32), on the
# accelerator: the suite's settings pin JAX to the CPU unless JAX_PLATFORMS names a platform.
PLATFORM=$(python -c "import jax; print(jax.devices()[0].platform)")
JAX_PLATFORMS=$PLATFORM timeout 300 python -m pytest -q -p no:cacheprovider \
  tests/learners/test_embedding_model.py tests/core/test_step.py tests/core/test_selection.py \
  tests/learners/test_cross_model.py tests/cli/test_cli.py tests/encode \
  -k "naive or equals or matches or export or sentence or cross or bfloat16 or compile" \
  -rf 2>&1 | tail -8 | tee "$OUT/parity.txt"
timeout 120 rmmjax bench core --quick --out "$OUT/bench_core.json" | tee "$OUT/bench_core.txt"
timeout 120 rmmjax bench encode --quick --data "$DATA" --out "$OUT/bench_encode.json" \
  | tee "$OUT/bench_encode.txt"
timeout 150 rmmjax bench cross --quick --data "$DATA" --out "$OUT/bench_cross.json" \
  | tee "$OUT/bench_cross.txt"
timeout 150 rmmjax bench scaling --quick --out "$OUT/bench_scaling.json" \
  | tee "$OUT/bench_scaling.txt"
rm -rf "$OUT/train"
timeout 150 rmmjax train --config locomo --set data="$DATA" --set steps=100 \
  --set checkpoint_every=50 --workdir "$OUT/train" --quiet | tee "$OUT/train.txt"
rm -rf "$OUT/cross"
# The cross reranker over the base hybrid's candidates, one epoch, K = 20, the questions alone
# (pinned: the variant's defaults would tune a query encoder first, read 50 candidates and the
# file's observations, and pretrain two epochs).
timeout 240 rmmjax train --config locomo --set data="$DATA" --set variant=cross \
  --set learner=reranker --set pretrain_epochs=1 --set compute_dtype=bfloat16 --set steps=20 \
  --set k=20 --set cross.observations=false \
  --workdir "$OUT/cross" | tee "$OUT/cross.txt"
git rev-parse HEAD > "$OUT/commit.txt" 2>/dev/null || true
echo "wrote $OUT"
