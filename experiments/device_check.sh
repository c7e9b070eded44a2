#!/usr/bin/env bash
# The accelerator benchmarks in one run, for the first time anyone has a GPU or TPU host:
#
#     bash experiments/device_check.sh            # on a host where JAX already sees the accelerator
#
# Installs the project (pip install ., which keeps the accelerator's jax if it satisfies ours), refuses to
# go on if JAX sees no GPU or TPU, then runs the Anakin, Sebulba and MuZero benchmarks with --accelerator
# (accelerator-sized batches on the host's own devices, about 8 minutes in all as planned; not yet timed on
# a device). Their tables go into docs/benchmarks.md under headings of their own ("... on an accelerator"),
# beside the CPU tables, and the whole log to device_check.log (or $OUT/device_check.log where OUT is set);
# then MuZero on Pong-v5 as the results page runs it (at most $MUZERO_MINUTES minutes, default 4), and
# then one table of the headline figures (Anakin at 4,096 envs, training and environment alone; Sebulba's
# IMPALA on Breakout-v5 beside Cleanba's per-GPU figure) to device_check.md (experiments/device_summary.py).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
log="${OUT:-.}/device_check.log"
: > "$log"  # this run's log only: the summary reads every BENCH line in it
python -m pip install --quiet .
python - <<'PY'
import sys

import jax

if jax.default_backend() == "cpu":
    sys.exit("device_check: JAX sees no GPU or TPU on this host (backend cpu); the CPU benchmarks run without "
             "--accelerator")
print(f"device_check: {jax.device_count()} x {jax.devices()[0].device_kind}, jax {jax.__version__}")
PY
start=$SECONDS
for bench in anakin sebulba muzero; do
    echo "device_check: benchmark_$bench --accelerator" | tee -a "$log"
    python "experiments/benchmark_$bench.py" --accelerator 2>&1 | tee -a "$log"
    echo "device_check: benchmark_$bench took $((SECONDS - start)) s so far" | tee -a "$log"
done
# MuZero on Atari as the results page runs it (the atari suite's sebulba-muzero-pong-v5), bounded in time:
# --max-minutes stops it resumably, and its row goes into docs/results.md (copied to $OUT) once it finished.
echo "device_check: results --suite atari --only sebulba-muzero-pong-v5 (at most ${MUZERO_MINUTES:-4} minutes)" | tee -a "$log"
python experiments/results.py --suite atari --only sebulba-muzero-pong-v5 --max-minutes "${MUZERO_MINUTES:-4}" 2>&1 \
    | tee -a "$log" || echo "device_check: the MuZero Atari run failed (see above)" | tee -a "$log"
if [ -n "${OUT:-}" ]; then cp docs/results.md "$OUT/"; fi
summary="${OUT:-.}/device_check.md"
echo "device_check: the headline table ($summary)" | tee -a "$log"
if [ -n "${OUT:-}" ]; then cp docs/benchmarks.md "$OUT/"; fi
python experiments/device_summary.py "$log" --out "$summary" | tee -a "$log" || echo "device_check: no summary table"
echo "device_check: done in $((SECONDS - start)) s; the tables are in docs/benchmarks.md"
