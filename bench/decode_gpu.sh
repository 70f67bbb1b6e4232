#!/usr/bin/env bash
# Decoding on the GPU machine: the key-warp, latent-cache (MLA), decoding and
# fused-combine GPU tests (the key-warp and fused-combine ones under
# compute-sanitizer's memcheck, racecheck and initcheck too), the case checks
# under compute-sanitizer, and the decoding benchmark rows (graph-timed)
# beside cuDNN, FA2, Flex and PyTorch with the copy bandwidth, in one process.
#
# Build here first (the GPU machine has no Rust):
#   T=target/toolchains/cuda/nvidia/cu13
#   LD_LIBRARY_PATH=$T/lib cargo run --release -p aec-bench --bin aec-bench -- \
#       bench/cases --nvcc $T/bin/nvcc -I $T/include
#   cp ../shared/reference/workloads.json bench/cases/
#   cargo test --release --test gpu_forward --no-run   # copy the binary to
#   target/gpu-run/gpu_forward
# and carry bench/cases and target/gpu-run. Logs and results.json go to $OUT.
set -u
OUT=${OUT:-/tmp/aec-out}
mkdir -p "$OUT"
DECODE=decode-gqa-b64-h32-kv8-kv4096-d128,decode-deepseek-b64-h16-kv4096-d192-v128,decode-gqa-b1-h32-kv8-kv32768-d128,decode-gqa-b8-h32-kv8-kv16384-d128,decode-mla-b64-h16-kv4096-d576-v512,decode-mla-b16-h128-kv4096-d576-v512
status=0
AEC_REQUIRE_GPU=1 target/gpu-run/gpu_forward ${GPU_TESTS:-key_warps latent decode paged fused_combine} --test-threads 1 \
    > "$OUT/gpu_forward.txt" 2>&1 || status=1
grep -E "^test |test result|rel_err|panicked" "$OUT/gpu_forward.txt" | tail -n 40
for test in key_warps fused_combine; do
    # initcheck: the split-KV workspaces are not zero-filled (src/run/mod.rs).
    for tool in memcheck racecheck initcheck; do
        AEC_REQUIRE_GPU=1 compute-sanitizer --tool $tool --error-exitcode 3 \
            target/gpu-run/gpu_forward gpu_forward_$test --test-threads 1 \
            >> "$OUT/sanitizer-$test.txt" 2>&1 || status=1
        echo "$tool $test: $(tail -n 2 "$OUT/sanitizer-$test.txt" | tr '\n' ' ')"
    done
done
python bench/gpu_check.py bench/cases --only mla_decode,mla_decode_gqa,decode --no-bench \
    > "$OUT/checks.txt" 2>&1 || status=1
cat "$OUT/checks.txt"
for tool in memcheck racecheck; do
    compute-sanitizer --tool $tool --error-exitcode 3 \
        python bench/gpu_check.py bench/cases --only mla_decode_gqa --no-bench \
        > "$OUT/sanitizer-$tool.txt" 2>&1 || status=1
    tail -n 3 "$OUT/sanitizer-$tool.txt"
done
python bench/gpu_check.py bench/cases --bench-only "$DECODE" > "$OUT/bench.txt" 2>&1 || status=1
grep -v -E "Warning|return F" "$OUT/bench.txt"
exit $status
