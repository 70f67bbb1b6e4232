"""What bench/fwd_ab.py, bench/bwd_ab.py and bench/power_ab.py share: their
command line, the forward builds and cuDNN's anchor, the timing and order of
rotated rounds, and their report (and with bench/gemm_power.py, `take_flag`)."""
import json, math, os, statistics, sys


def take_flag(args, name, default, conv, doc):
    """The value after `name` in `args` (removed from it) through `conv`, or
    `default` without the flag; exits with `doc` where the value is missing."""
    if name not in args:
        return default
    i = args.index(name)
    if i + 1 >= len(args):
        sys.exit(doc)
    value = conv(args[i + 1])
    del args[i:i + 2]
    return value


def command_line(doc):
    """`<workload> <rounds> <cases_dir>... [--no-check]` from sys.argv: (the
    workload, rounds, case dirs, whether to check outputs). Leaves sys.argv
    as gpu_check reads it at import (its first case dir)."""
    args = sys.argv[1:]
    check = "--no-check" not in args
    args = [a for a in args if a != "--no-check"]
    if len(args) < 3 or not args[1].isdigit() or int(args[1]) < 1:
        sys.exit(doc)
    wl_id, rounds, dirs = args[0], int(args[1]), args[2:]
    sys.argv = [sys.argv[0], dirs[0]]
    return wl_id, rounds, dirs, check


def forward_case(tool, wl_id, dirs):
    """(gpu_check, workload `wl_id`, each case dir's forward bound to the
    workload's random inputs as `run(**launch_options)`, cuDNN's forward on
    the same inputs or None) for `tool`, on the GPU."""
    import torch
    import gpu_check as g
    torch.zeros(1, device="cuda")
    builds, w = forward_builds(g, tool, wl_id, dirs)
    sizes = dict(B=w["b"], H=w["h"], Hkv=w["hkv"], Sq=w["sq"], Skv=w["skv"])
    q, k, v, _ = g.backward_inputs(w)
    cu = g.workload_customs(w)
    runs = {d: (lambda fk=fk, **opts: fk(q, k, v, cu, sizes, **opts)) for d, fk in builds.items()}
    return g, w, runs, cudnn_forward(w, q, k, v)


def forward_builds(g, tool, wl_id, dirs):
    """(the forward kernel of workload `wl_id` per case dir, the workload)
    for `tool`, which exits naming a dir without one."""
    builds, w = {}, None
    for d in dirs:
        index = json.load(open(os.path.join(d, "index.json")))
        entries = {e["workload"]: e for e in index["bench"]}
        entry = entries.get(wl_id)
        if entry is None or "kernel" not in entry or "error" in entry:
            sys.exit(f"{tool}: no forward kernel for `{wl_id}` in {d} (have: {', '.join(entries)})")
        if w is None:
            w = g.workloads_by_id(d, index)[wl_id]
        builds[d] = g.Kernel(d, entry["kernel"])
    return builds, w


def cudnn_forward(w, q, k, v):
    """cuDNN's SDPA forward of workload `w` on q, k, v as a closure, or None
    where the workload is no plain softmax (no anchor to compare with)."""
    if w["variant"] != "softmax" or w.get("window"):
        return None
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel, SDPBackend

    def cudnn():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=w["causal"],
                                                  scale=w.get("scale", 1 / math.sqrt(w["dqk"])),
                                                  enable_gqa=w["hkv"] != w["h"])
    return cudnn


def timed(f):
    """`f`'s median time (ms) over do_bench's repetitions."""
    import triton
    return triton.testing.do_bench(f, warmup=25, rep=200, return_mode="median")


def rotated(dirs, r):
    """The builds in round `r`'s order: the list rotated by `r`."""
    return dirs[r % len(dirs):] + dirs[:r % len(dirs)]


def report(wl_id, times, base, base_label, flops):
    """Per implementation: the median over rounds (µs), its TFLOP/s for
    `flops`, the ratio to `base`'s median and every round."""
    base_ms = statistics.median(times[base])
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{wl_id} {name:28s} {med * 1e3:9.1f} us  {flops / (med * 1e-3) / 1e12:6.1f} TF/s  "
              f"{base_label}/this {base_ms / med:.3f}  rounds {' '.join(f'{t * 1e3:.1f}' for t in ts)}", flush=True)
