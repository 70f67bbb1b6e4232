#!/usr/bin/env bash
# Tunes the forward of every parallel and recurrent workload of
# shared/reference/workloads.json on the GPU present with `aec tune`
# (model ranking, parallel NVRTC compilation, the default and the model's
# top plans profiled with rotated inputs), writing one JSON report per
# workload and the tuning cache to $OUT. Built here first (no GPU needed):
#   cargo build --release && mkdir -p target/gpu-bin && cp target/release/aec target/gpu-bin/
# and carried: target/gpu-bin. TOP (default 8) plans are profiled besides
# the default; ONLY (substrings of the workload ids, comma-separated)
# narrows the run (one run: the merged report holds only its workloads).
# BACKWARD=1 tunes the backward instead (`aec tune --backward`: its tile
# space in order, no cost model) of the parallel workloads that have one
# (not the decoding ones), into tune-backward-all.json. The recurrent
# workloads' forward is tuned over its tile space (no cost model either).
set -u
OUT=${OUT:-/tmp/aec-out}
mkdir -p "$OUT"
export AEC_CACHE_DIR=/tmp/aec-cache AEC_TUNING_CACHE="$OUT/tuning-cache.json"
AEC=target/gpu-bin/aec
# GQA with a causal mask: the GQA example plus the causal example's mask.
sed 's/modify_q = |q| q \* rsqrt(Dqk);/modify_q = |q| q * rsqrt(Dqk);\n        mask = |b, h, i, j| i >= j;/' \
  examples/softmax_gqa.rs >/tmp/softmax_gqa_causal.rs
status=0
KIND=() ALL=tune-all.json
if [ "${BACKWARD:-0}" = 1 ]; then KIND=(--backward); ALL=tune-backward-all.json; fi
while read -r id file dims shape; do
  case "$id" in "#"*|"") continue ;; esac
  if [ -n "${ONLY:-}" ]; then
    keep=0
    IFS=, read -ra only <<<"$ONLY"
    for o in "${only[@]}"; do [[ "$id" == *"$o"* ]] && keep=1; done
    [ "$keep" = 1 ] || continue
  fi
  case "$id" in
    decode-*|retention-recurrent-*|gated-retention-*|mamba2-*) [ "${BACKWARD:-0}" = 1 ] && continue ;;
  esac
  # Mamba2's decay exp(dt · a) needs a < 0 (the profiler's default range is [0.5, 1)).
  RANGES=()
  case "$id" in mamba2-*) RANGES=(--custom-range a=-4,-0.5 --custom-range dt=0.01,0.2) ;; esac
  echo "== $id"
  start=$(date +%s%N)
  timeout 300 "$AEC" tune "$file" "${KIND[@]}" "${RANGES[@]}" --head-dims "$dims" --shape "$shape" --top "${TOP:-8}" \
    --json "$OUT/tune-$id.json" 2>"$OUT/tune-$id.err" || { status=1; tail -5 "$OUT/tune-$id.err"; }
  echo "wall $(( ($(date +%s%N) - start) / 1000000 )) ms"
done <<'LIST'
softmax-b8-h32-s2048-d128 examples/softmax.rs 128 8,32,32,2048,2048
softmax-b1-h32-s8192-d128 examples/softmax.rs 128 1,32,32,8192,8192
softmax-causal-b8-h32-s2048-d128 examples/softmax_causal.rs 128 8,32,32,2048,2048
softmax-causal-b1-h32-s8192-d128 examples/softmax_causal.rs 128 1,32,32,8192,8192
softmax-gqa-causal-b8-h32-kv8-s2048-d128 /tmp/softmax_gqa_causal.rs 128 8,32,8,2048,2048
deepseek-causal-b8-h16-s2048-d192-v128 examples/deepseek.rs 192x128 8,16,16,2048,2048
diff-causal-b8-h12-s2048-d128-v256 examples/diff_transformer.rs 128x256 8,12,12,2048,2048
sigmoid-b8-h32-s2048-d128 examples/sigmoid.rs 128 8,32,32,2048,2048
relu-b64-h6-s1024-d64 examples/relu.rs 64 64,6,6,1024,1024
retnet-parallel-b2-h32-s2048-d256-v512 examples/retnet_parallel.rs 256x512 2,32,32,2048,2048
decode-deepseek-b64-h16-kv4096-d192-v128 examples/decode.rs 192x128 64,16,16,1,4096
decode-gqa-b64-h32-kv8-kv4096-d128 examples/decode.rs 128 64,32,8,1,4096
retention-recurrent-b2-h32-s4096-d256-v512 examples/retnet_recurrent.rs 256x512 2,32,4096
gated-retention-b2-h40-s4096-d256-v256 examples/gated_retention.rs 256x256 2,40,4096
mamba2-b2-h80-s4096-d128-v64 examples/mamba2.rs 128x64 2,80,4096
LIST
# One file for all workloads (the device returns few files).
python3 - "$OUT" "$ALL" <<'PY'
import glob, json, os, sys
out, name = sys.argv[1], sys.argv[2]
rows = []
for f in sorted(glob.glob(os.path.join(out, "tune-*.json"))):
    if os.path.basename(f).startswith(("tune-all", "tune-backward")):
        continue  # merged files of earlier runs
    wid = os.path.basename(f)[len("tune-"):-len(".json")]
    rows.append({"workload": wid, **json.load(open(f))})
    os.remove(f)
json.dump({"tuned": rows}, open(os.path.join(out, name), "w"), indent=1)
for f in glob.glob(os.path.join(out, "tune-*.err")):
    if os.path.getsize(f) == 0:
        os.remove(f)
PY
exit $status
