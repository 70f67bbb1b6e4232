#!/usr/bin/env bash
# The cluster pair's K/V multicast (ForwardConfig::kv_multicast) on a GPU
# machine, from the repository root: its GPU tests against the f64
# reference, memcheck and racecheck on the small ones, then the benchmark
# forwards with and without it in rotated rounds next to cuDNN (fwd_ab.py)
# and DeepSeek's sustained energy a launch (power_ab.py); first, how many of
# its clusters the GPU holds at once (cluster_occupancy.py). Built beforehand
# on a machine with Rust (T: the pinned CUDA toolchain's directory, see
# bench/NOTES.md; abl/ is git-ignored and travels with `carry`):
#   cargo test --release --test gpu_forward --no-run   # then copy the binary to target/gpu-bin/gpu_forward
#   W=<workload ids, comma-separated>
#   AEC_CUDA_INCLUDE=$T/include AEC_CUDA_BIN=$T/bin LD_LIBRARY_PATH=$T/lib \
#     ./target/release/aec-bench abl/base --nvrtc --workloads $W
#   ... ./target/release/aec-bench abl/mc --nvrtc --kv-multicast --workloads $W
#   cp ../shared/reference/workloads.json abl/base/; cp ../shared/reference/workloads.json abl/mc/
# Usage: bash bench/multicast_gpu.sh <base cases dir> <multicast cases dir> [rounds]
# Logs go to $OUT (default /tmp/aec-out). Session 74 (H200): correct, and every
# forward 14–31% slower with the multicast (bench/NOTES.md).
set -u -o pipefail
BASE=${1:?usage: multicast_gpu.sh <base cases dir> <multicast cases dir> [rounds]}
MC=${2:?usage: multicast_gpu.sh <base cases dir> <multicast cases dir> [rounds]}
ROUNDS=${3:-5}
OUT=${OUT:-/tmp/aec-out}
mkdir -p "$OUT"
export AEC_REQUIRE_GPU=1 AEC_CACHE_DIR=/tmp/aec-cache PYTHONUNBUFFERED=1
status=0
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv >"$OUT/gpu.txt"
if [ -x target/gpu-bin/gpu_forward ]; then
  timeout 300 target/gpu-bin/gpu_forward kv_multicast --test-threads=1 --nocapture >"$OUT/gpu_forward_kv_multicast.log" 2>&1 || status=1
  grep -E "PASS|FAIL|test result|panicked" "$OUT/gpu_forward_kv_multicast.log"
  SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
  for tool in memcheck racecheck; do
    [ -n "${SAN:-}" ] || { echo "compute-sanitizer not found"; break; }
    timeout 300 "$SAN" --tool $tool --error-exitcode 9 target/gpu-bin/gpu_forward gpu_forward_kv_multicast --exact \
      --test-threads=1 >"$OUT/sanitizer-$tool-kv_multicast.log" 2>&1
    echo "$tool gpu_forward_kv_multicast: exit $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer-$tool-kv_multicast.log" | tail -1)"
  done
else
  echo "missing target/gpu-bin/gpu_forward"
  status=1
fi
# Whether the GPU holds the grid's floor(SMs / 2) clusters of each kernel at once.
python3 bench/cluster_occupancy.py "$MC" 2>&1 | tee "$OUT/cluster_occupancy.txt" || status=1
# Every benchmark workload both builds have, in rotated rounds: the relative
# error against cuDNN first (fwd_ab.py stops on a disagreement).
for w in $(python3 -c "import json,sys; print(' '.join(b['workload'] for b in json.load(open(sys.argv[1] + '/index.json'))['bench']))" "$MC"); do
  echo "== $w" | tee -a "$OUT/fwd_ab.txt"
  timeout 150 python3 bench/fwd_ab.py "$w" "$ROUNDS" "$BASE" "$MC" 2>&1 | tee -a "$OUT/fwd_ab.txt" || status=1
done
w=deepseek-causal-b8-h16-s2048-d192-v128
if grep -q "\"$w\"" "$MC/index.json"; then
  echo "== power $w" | tee -a "$OUT/power_ab.txt"
  timeout 150 python3 bench/power_ab.py "$w" 2 "$BASE" "$MC" 2>&1 | tee -a "$OUT/power_ab.txt" || status=1
fi
exit $status
