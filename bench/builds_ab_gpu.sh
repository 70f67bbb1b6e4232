#!/usr/bin/env bash
# Two or more builds of the benchmark's kernels compared in rotated rounds on
# a GPU machine, from the repository root: for every workload the first cases
# directory holds, the forwards (fwd_ab.py: relative error against cuDNN or
# the first build first, then kernel times) and, where the workload has one,
# the backwards (bwd_ab.py: dQ, dK and dV checked, then the three kernels and
# the main kernel alone timed). For a change meant to keep every kernel's
# speed level or better, such as session 73's register work (abl/pre73 built
# at f78f070, abl/base at the session's HEAD; bench/NOTES.md session 73).
# Each cases directory comes from
#   AEC_CUDA_INCLUDE=$T/include AEC_CUDA_BIN=$T/bin LD_LIBRARY_PATH=$T/lib \
#     ./target/release/aec-bench <dir> --nvrtc --workloads <ids>
#   cp ../shared/reference/workloads.json <dir>/
# built by the revision under test (abl/ is git-ignored; `carry` takes it).
# Usage: bash bench/builds_ab_gpu.sh <cases dir> <cases dir> [<cases dir> ...]
# ROUNDS (default 5) rounds per workload; logs go to $OUT (default /tmp/aec-out).
set -u -o pipefail
[ $# -ge 2 ] || { echo "usage: builds_ab_gpu.sh <cases dir> <cases dir> [<cases dir> ...]"; exit 2; }
ROUNDS=${ROUNDS:-5}
OUT=${OUT:-/tmp/aec-out}
mkdir -p "$OUT"
export AEC_CACHE_DIR=/tmp/aec-cache PYTHONUNBUFFERED=1
status=0
for d in "$@"; do
  [ -f "$d/index.json" ] && [ -f "$d/workloads.json" ] || { echo "$d: no index.json or workloads.json"; exit 2; }
  echo "$d: $(cat "$d/BUILT_AT" 2>/dev/null)" | tee -a "$OUT/builds.txt"
done
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,temperature.gpu --format=csv >"$OUT/gpu.txt"
listed() {  # the first build's workloads, those with a backward if $1 is "bwd"
  python3 -c "
import json, sys
bench = json.load(open(sys.argv[1] + '/index.json'))['bench']
print(' '.join(b['workload'] for b in bench if sys.argv[2] != 'bwd' or b.get('backward')))" "$1" "$2"
}
for w in $(listed "$1" fwd); do
  echo "== $w" | tee -a "$OUT/fwd_ab.txt"
  timeout 150 python3 bench/fwd_ab.py "$w" "$ROUNDS" "$@" 2>&1 | tee -a "$OUT/fwd_ab.txt" || status=1
done
for w in $(listed "$1" bwd); do
  echo "== $w" | tee -a "$OUT/bwd_ab.txt"
  timeout 200 python3 bench/bwd_ab.py "$w" "$ROUNDS" "$@" 2>&1 | tee -a "$OUT/bwd_ab.txt" || status=1
done
exit $status
