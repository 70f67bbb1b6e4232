#!/usr/bin/env bash
# The variable-length, paged and block-sparse forwards on a GPU machine, from the repository root:
# the Rust GPU tests (gpu_forward, gpu_backward; built here with
#   cargo test --release --test gpu_forward --test gpu_backward --no-run
# and copied to target/gpu-bin/), compute-sanitizer on the varlen cases, then
# bench/varlen_bench.py, bench/paged_bench.py and bench/block_sparse_bench.py on the kernels of
#   aec-bench bench/varlen-cases --nvcc <nvcc> --varlen-only
# Logs and results go to $OUT (default /tmp/aec-out).
set -u
OUT=${OUT:-/tmp/aec-out}
mkdir -p "$OUT"
export AEC_REQUIRE_GPU=1 AEC_CACHE_DIR=/tmp/aec-cache
status=0
for t in ${TESTS:-gpu_forward gpu_backward}; do
  target/gpu-bin/$t --test-threads=1 --nocapture ${FILTER:-} >"$OUT/$t.log" 2>&1 || status=1
  grep -E "PASS|FAIL|test result|panicked" "$OUT/$t.log"
done
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
for tool in memcheck racecheck; do
  for case in ${SAN_CASES:-gpu_varlen_softmax_causal gpu_varlen_softmax_causal_sm80_template gpu_varlen_decode gpu_paged_decode gpu_paged_prefill gpu_block_sparse}; do
    "$SAN" --tool $tool --error-exitcode 9 target/gpu-bin/gpu_forward $case --exact --test-threads=1 \
      >"$OUT/sanitizer-$tool-$case.log" 2>&1
    rc=$?; [ $rc -eq 0 ] || status=1
    echo "$tool $case: exit $rc $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer-$tool-$case.log" | tail -1)"
  done
done
for b in ${BENCHES:-varlen paged block_sparse}; do
  python3 bench/${b}_bench.py bench/varlen-cases >"$OUT/${b}_bench.log" 2>&1 || status=1
  grep -E "^bench|copy|Error" "$OUT/${b}_bench.log" | cut -c1-220
done
exit $status
