"""Runs one workload's backward a few times — ours (the benchmark's three
kernels) and cuDNN's SDPA backward on the same tensors — for a profiler, and
prints each kernel's launch configuration as torch.profiler records it
(grid, block, registers, shared memory): cuDNN's kernels are generated at run
time, so this is where their tile shape shows.

    python bench/profile_bwd.py bench/cases softmax-b8-h32-s2048-d128 [--trace]
    ncu --section SpeedOfLight -k regex:'flash_bprop|aec_bwd.*_main' \\
        python bench/profile_bwd.py bench/cases softmax-b8-h32-s2048-d128
"""
import os, sys
import torch

sys.path.insert(0, os.path.dirname(__file__))
from gpu_check import (Kernel, BackwardKernel, backward_inputs, cudnn_kept_forward, rel_err,  # noqa: E402
                       workloads_by_id)
import json  # noqa: E402

cases_dir, work = sys.argv[1], sys.argv[2]
index = json.load(open(os.path.join(cases_dir, "index.json")))
w = workloads_by_id(cases_dir, index)[work]
entry = next(e for e in index["bench"] if e["workload"] == work)
sizes = dict(B=w["b"], H=w["h"], Hkv=w["hkv"], Sq=w["sq"], Skv=w["skv"])
q, k, v, do = backward_inputs(w)
out, leaves = cudnn_kept_forward(w, q, k, v)
fk = Kernel(cases_dir, entry["kernel"])
bk = BackwardKernel(cases_dir, entry["backward"])
o, rowout = fk(q, k, v, {}, sizes)


def cudnn_bwd():
    return torch.autograd.grad(out, leaves, do, retain_graph=True)


def ours_bwd():
    return bk(q, k, v, o, do, rowout, {}, sizes)


ref = cudnn_bwd()
got = ours_bwd()
torch.cuda.synchronize()
print("rel. error against cuDNN:", max(rel_err(x.float(), y.float()) for x, y in zip(got[:3], ref)))
if "--trace" in sys.argv:
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            cudnn_bwd()
            ours_bwd()
        torch.cuda.synchronize()
    path = "/tmp/profile_bwd_trace.json"
    prof.export_chrome_trace(path)
    seen = set()
    for ev in json.load(open(path))["traceEvents"]:
        if ev.get("cat") != "kernel" or ev["name"] in seen:
            continue
        seen.add(ev["name"])
        a = ev.get("args", {})
        print(f"{ev['name'][:110]}\n    {ev.get('dur', 0):.1f} us  grid {a.get('grid')}  block {a.get('block')}  "
              f"regs {a.get('registers per thread')}  smem {a.get('shared memory')}  "
              f"blocks/SM {a.get('blocks per SM')}  warps/SM {a.get('warps per SM')}")
else:
    for _ in range(3):
        cudnn_bwd()
        ours_bwd()
    torch.cuda.synchronize()
