"""The declared workloads' untuned tiles of a kernel library, on a GPU.

    # here, with NVRTC: the same variants twice, with and without workloads
    aec compile examples/softmax.rs examples/softmax_causal.rs examples/softmax_gqa.rs \
        examples/decode.rs --target h100,h200 --no-tuning \
        --workload B=1,H=12,Sq=300,Skv=300 --workload B=1,H=32,Hkv=8,Skv=32768 … -o WITH
    aec compile examples/softmax.rs examples/softmax_causal.rs examples/softmax_gqa.rs \
        examples/decode.rs --target h100,h200 --no-tuning -o WITHOUT
    # there:
    python bench/library_workload_tiles.py WITH WITHOUT

For every forward record of WITH whose `tuned_for` names this GPU's product
(a declared workload's untuned tile, `aec compile --workload`), at each of
its workloads' sizes: the call through WITH's PyTorch module runs that tile
(`last_entry`), the same call through WITHOUT runs the default, both match a
float64 reference (relative error at most 2e-2), and both are timed in this
process in three alternating rounds: the kernels' device time per call by
the profiler (main kernel and combine; median of the rounds; `speedup` is
its ratio) and the time per call through
the module (triton's do_bench median, the lower of the rounds; host-bound at
these sizes), and the time per call of CUDA-graph replays of 20 calls
captured through the module (whose replayed output is checked too).
Softmax, SoftmaxCausal (Sq = Skv), SoftmaxGqa and Decode (Sq = 1, the
decoding rule's tiles: split-KV with the combine, packed query heads).

Results go to $OUT/library_workload_tiles.json; exit status 1 if a check fails.
"""
import datetime
import json
import math
import os
import statistics
import sys

import torch

OUT = os.environ.get("OUT", "/tmp/aec-out")
TOL = 2e-2

args = [a for a in sys.argv[1:] if not a.startswith("--")]
if len(args) != 2:
    sys.exit(__doc__)
WITH, WITHOUT = args
sys.path.insert(0, os.path.join(WITH, "python"))
import aec_library  # noqa: E402

dev = torch.device("cuda")


def ref(q, k, v, causal):
    """softmax(q · kᵀ / √D) · v in float64, K/V heads shared by groups of
    query heads (query head h reads K/V head h // G), causal over Sq = Skv."""
    b, h, sq, d = q.shape
    hkv, skv, dv = k.shape[1], k.shape[2], v.shape[3]
    # A group's query rows together, so K and V are not repeated.
    qg = q.double().reshape(b, hkv, (h // hkv) * sq, d)
    s = qg @ k.double().transpose(-1, -2) / math.sqrt(d)
    if causal:
        s = s.masked_fill(torch.ones(sq, skv, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    return (torch.softmax(s, dim=-1) @ v.double()).reshape(b, h, sq, dv)


def rel_err(ours, want):
    ours, want = ours.double(), want.double()
    return ((ours - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()


def kernel_time(call, n=40):
    """The device time of the aec kernels one `call` launches (all of them:
    a split-KV call's combine too), µs per call over n calls, by the
    profiler's kernel records, so host time between launches is left out;
    after a warm-up."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(10):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            call()
        torch.cuda.synchronize()
    return sum(e.time_range.elapsed_us() for e in prof.events()
               if e.name.startswith("aec_") and "CUDA" in str(e.device_type)) / n


def graphed(f, ins, n=20):
    """n calls of f(*ins) captured in one CUDA graph (after a warm-up on a
    side stream, as PyTorch asks): the graph and the last call's output."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            f(*ins)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [f(*ins) for _ in range(n)]
    return graph, outs[-1], n


def replay_us(graph, calls, reps=20):
    """The median time of one replay over `calls` calls, µs per call."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(reps):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(times)


def sizes_of(workload):
    return {k.strip(): int(n) for k, n in (p.split("=") for p in workload.split(",") if p.strip())}


def main():
    import triton

    os.makedirs(OUT, exist_ok=True)
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    with_lib, without_lib = aec_library.load(WITH), aec_library.load(WITHOUT)
    print(f"{with_lib!r}; {without_lib!r}", flush=True)
    rows, cases = [], []
    for name in ("Softmax", "SoftmaxCausal", "SoftmaxGqa", "Decode"):
        if name not in with_lib.variants or name not in without_lib.variants:
            continue
        for k in with_lib[name].record["kernels"]:
            if k.get("pass") != "forward":
                continue
            for item in k.get("tuned_for") or ():
                if "device" not in item or not aec_library.is_for_gpu(item, with_lib.device_name, with_lib.sms):
                    continue
                z = sizes_of(item["workload"])
                # (Decode fixes Sq at 1: its workloads do not name it.)
                b, h, sq, skv = z["B"], z["H"], z.get("Sq", 1), z["Skv"]
                hkv = z.get("Hkv", h)
                d = k["head_dims"]["Dqk"]
                torch.manual_seed(0)
                q = torch.randn(b, h, sq, d, device=dev, dtype=torch.bfloat16)
                kk = torch.randn(b, hkv, skv, d, device=dev, dtype=torch.bfloat16)
                vv = torch.randn(b, hkv, skv, k["head_dims"]["Dv"], device=dev, dtype=torch.bfloat16)
                want = ref(q, kk, vv, causal=name == "SoftmaxCausal")
                row = dict(variant=name, workload=item["workload"], tile=item["config_label"],
                           chosen_by=item["chosen_by"], model_speedup=item.get("model_speedup"))
                fw, fo = with_lib[name], without_lib[name]
                with torch.no_grad():
                    row["rel_err_tile"] = rel_err(fw(q, kk, vv), want)
                    row["ran_tile"] = fw.last_entry
                    row["rel_err_default"] = rel_err(fo(q, kk, vv), want)
                    row["ran_default"] = fo.last_entry
                row["passed"] = (row["ran_tile"] == k["entry"] and row["ran_default"] != k["entry"]
                                 and row["rel_err_tile"] <= TOL and row["rel_err_default"] <= TOL)
                rows.append(row)
                cases.append((row, fw, fo, (q, kk, vv), want))
    # Every call timing before any profiling: the profiler's hooks slow
    # later calls. Three alternating rounds each.
    with torch.no_grad():
        for row, fw, fo, ins, _ in cases:
            calls = {"tile": [], "default": []}
            for _ in range(3):
                for label, f in (("tile", fw), ("default", fo)):
                    calls[label].append(triton.testing.do_bench(lambda f=f: f(*ins), warmup=50, rep=200,
                                                                return_mode="median"))
            # At these sizes a call through the module is host-bound (its
            # Python and ctypes work outlasts the kernel).
            row["tile_call_us"] = 1e3 * min(calls["tile"])
            row["default_call_us"] = 1e3 * min(calls["default"])
        # The same calls captured in CUDA graphs (as a serving or training
        # step would be): the module's host work is paid once at capture.
        for row, fw, fo, ins, want in cases:
            graphs = {label: graphed(f, ins) for label, f in (("tile", fw), ("default", fo))}
            replays = {"tile": [], "default": []}
            for label, (graph, out, calls) in graphs.items():
                graph.replay()
                torch.cuda.synchronize()
                row[f"graph_rel_err_{label}"] = rel_err(out, want)
            for _ in range(3):
                for label, (graph, _, calls) in graphs.items():
                    replays[label].append(replay_us(graph, calls))
            row["tile_graph_us"] = min(replays["tile"])
            row["default_graph_us"] = min(replays["default"])
            row["graph_speedup"] = row["default_graph_us"] / row["tile_graph_us"]
            row["passed"] = (row["passed"] and row["graph_rel_err_tile"] <= TOL
                             and row["graph_rel_err_default"] <= TOL)
        for row, fw, fo, ins, _ in cases:
            kernels = {"tile": [], "default": []}
            for _ in range(3):
                for label, f in (("tile", fw), ("default", fo)):
                    kernels[label].append(kernel_time(lambda f=f: f(*ins)))
            row["tile_us"] = statistics.median(kernels["tile"])
            row["default_us"] = statistics.median(kernels["default"])
            row["speedup"] = row["default_us"] / row["tile_us"]
            print(("PASS " if row["passed"] else "FAIL ") + " ".join(
                f"{key}={val:.3f}" if isinstance(val, float) else f"{key}={val}" for key, val in row.items()
                if key != "passed"), flush=True)
    ok = bool(rows) and all(r["passed"] for r in rows)
    if not rows:
        print(f"FAIL no workload tiles in {WITH} for {with_lib.device_name} ({with_lib.sms} SMs)", flush=True)
    speedups = [r["speedup"] for r in rows]
    graph_speedups = [r["graph_speedup"] for r in rows]
    summary = dict(
        geomean_graph_speedup=math.exp(sum(map(math.log, graph_speedups)) / len(graph_speedups)) if rows else None,
        workloads=len(rows),
        geomean_speedup=math.exp(sum(map(math.log, speedups)) / len(speedups)) if speedups else None,
        min_speedup=min(speedups, default=None), max_speedup=max(speedups, default=None),
    )
    print(f"summary {summary}", flush=True)
    result = dict(device=torch.cuda.get_device_name(), date=started, torch=torch.__version__,
                  command=os.environ.get("AEC_COMMAND", "python bench/library_workload_tiles.py " + " ".join(sys.argv[1:])),
                  commit=os.environ.get("AEC_COMMIT", "unknown"), tolerance=TOL, passed=ok, summary=summary, rows=rows)
    with open(os.path.join(OUT, "library_workload_tiles.json"), "w") as fh:
        json.dump(result, fh, indent=1)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
