#!/usr/bin/env bash
# The recurrent kernels on a GPU machine, from the repository root: the Rust
# GPU tests (forward and backward against the f64 reference), compute-sanitizer
# on the backward, then bench/recurrent_check.py (cases + benchmark next to
# flash-linear-attention and a chunked PyTorch implementation, same process).
#
# Built here first (no GPU needed):
#   cargo test --release --test gpu_recurrent --no-run   # copy the binary to target/gpu-bin/gpu_recurrent
#   T=target/toolchains/cuda/nvidia/cu13
#   LD_LIBRARY_PATH=$T/lib cargo run --release -p aec-bench -- bench/cases --nvcc $T/bin/nvcc -I $T/include --recurrent-only
#   cp ../shared/reference/workloads.json bench/cases/
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 -d .whl fla-core==0.6.0
# and carried: target/gpu-bin, bench/cases, .whl. Logs and recurrent.json go to $OUT.
# `bash bench/recurrent_gpu.sh tests` runs the tests and sanitizers only,
# `bash bench/recurrent_gpu.sh bench` the check script only (each fits one
# 10-minute device call); no argument runs both. TESTS (a filter, default
# gpu_) and SAN_CASES (the tests run under each sanitizer) narrow a run.
set -u
OUT=${OUT:-/tmp/aec-out}
mkdir -p "$OUT"
export AEC_REQUIRE_GPU=1 AEC_CACHE_DIR=/tmp/aec-cache
status=0
PART=${1:-all}
if [ "$PART" != bench ]; then
target/gpu-bin/gpu_recurrent --test-threads=1 --nocapture ${TESTS:-gpu_} >"$OUT/gpu_recurrent.log" 2>&1 || status=1
grep -E "PASS|FAIL|test result|panicked" "$OUT/gpu_recurrent.log"
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
if [ -n "${SAN:-}" ]; then
  for tool in memcheck racecheck initcheck; do
    for case in ${SAN_CASES:-gpu_recurrent_backward_rfa gpu_recurrent_backward_mamba2 gpu_recurrent_decode_every_example gpu_recurrent_varlen gpu_recurrent_varlen_backward gpu_recurrent_gla}; do
      timeout 240 "$SAN" --tool $tool --error-exitcode 9 target/gpu-bin/gpu_recurrent $case --exact --test-threads=1 \
        >"$OUT/sanitizer-$tool-$case.log" 2>&1
      echo "$tool $case: exit $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer-$tool-$case.log" | tail -1)"
    done
  done
else
  echo "compute-sanitizer not found"
fi
fi
[ "$PART" = tests ] && exit $status
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  >"$OUT/pip.log" 2>&1 && export PYTHONPATH=/tmp/site || echo "fla install failed (see pip.log)"
python bench/recurrent_check.py bench/cases 2>&1 | tee "$OUT/recurrent_check.log" | grep -vE "^\s*$" || status=1
exit $status
