#!/usr/bin/env bash
# Runs the Rust GPU tests (built here with
#   cargo test --release --test gpu_forward --test gpu_backward --test gpu_recurrent --no-run
# and copied to target/gpu-bin/) on a GPU machine from the repository root,
# then compute-sanitizer memcheck and racecheck on small backward cases and
# the cluster pair's multicast forward.
# All of it takes longer than one 600 s device call (H200, session 73:
# gpu_forward 395 s, gpu_backward 141 s): TESTS picks the binaries (default
# "gpu_forward gpu_backward gpu_recurrent"), SANITIZE=0 skips the sanitizers.
# Logs go to $OUT (default /tmp/aec-out).
set -u
OUT=${OUT:-/tmp/aec-out}
mkdir -p "$OUT"
export AEC_REQUIRE_GPU=1 AEC_CACHE_DIR=/tmp/aec-cache
status=0
for t in ${TESTS:-gpu_forward gpu_backward gpu_recurrent}; do
  [ -x target/gpu-bin/$t ] || { echo "missing target/gpu-bin/$t"; status=1; continue; }
  target/gpu-bin/$t --test-threads=1 --nocapture "$@" >"$OUT/$t.log" 2>&1 || status=1
  grep -E "PASS|FAIL|test result|panicked" "$OUT/$t.log"
done
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
if [ "${SANITIZE:-1}" = 0 ]; then
  echo "sanitizers skipped (SANITIZE=0)"
elif [ -n "${SAN:-}" ]; then
  for tool in memcheck racecheck; do
    # On sm_90a the first four run the warp-specialised wgmma backward: a
    # warpgroup per 64 keys, both on the same keys for DeepSeek's 192/128;
    # ALiBi and the document mask add custom-input gradients and skipped
    # tiles. RetNet's 256/512 runs the split kernel with shared scores (no
    # producer), and the last the causal kernels without the producer: the
    # paths whose thread and block indices session 75 re-reads.
    for case in gpu_backward_softmax_gqa gpu_backward_deepseek gpu_backward_alibi gpu_backward_document_mask \
        gpu_backward_retnet_parallel_dv512 gpu_backward_wgmma_without_producer; do
      "$SAN" --tool $tool --error-exitcode 9 target/gpu-bin/gpu_backward $case --exact --test-threads=1 \
        >"$OUT/sanitizer-$tool-$case.log" 2>&1
      echo "$tool $case: exit $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer-$tool-$case.log" | tail -1)"
    done
    # The cluster pair's K/V multicast: copies into the peer's shared memory
    # and arrivals on its barriers.
    "$SAN" --tool $tool --error-exitcode 9 target/gpu-bin/gpu_forward gpu_forward_kv_multicast --exact --test-threads=1 \
      >"$OUT/sanitizer-$tool-gpu_forward_kv_multicast.log" 2>&1
    echo "$tool gpu_forward_kv_multicast: exit $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer-$tool-gpu_forward_kv_multicast.log" | tail -1)"
  done
else
  echo "compute-sanitizer not found"
fi
exit $status
