"""Runs one workload's backward a few times — ours (the benchmark's three
kernels) and cuDNN's SDPA backward on the same tensors — for a profiler, and
prints each kernel's launch configuration as torch.profiler records it
(grid, block, registers, shared memory): cuDNN's kernels are generated at run
time, so this is where their tile shape shows.

    python bench/profile_bwd.py bench/cases softmax-b8-h32-s2048-d128 [--trace]
    ncu --section SpeedOfLight -k regex:'flash_bprop|aec_bwd.*_main' \\
        python bench/profile_bwd.py bench/cases softmax-b8-h32-s2048-d128
"""
import math, os, sys
import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend

sys.path.insert(0, os.path.dirname(__file__))
from gpu_check import Kernel, BackwardKernel, dev, rel_err, workloads_by_id  # noqa: E402
import json  # noqa: E402

cases_dir, work = sys.argv[1], sys.argv[2]
index = json.load(open(os.path.join(cases_dir, "index.json")))
w = workloads_by_id(cases_dir, index)[work]
entry = next(e for e in index["bench"] if e["workload"] == work)
b, h, hkv, sq, skv, dqk, dv = w["b"], w["h"], w["hkv"], w["sq"], w["skv"], w["dqk"], w["dv"]
torch.manual_seed(0)
q = torch.randn(b, h, sq, dqk, device=dev, dtype=torch.bfloat16)
k = torch.randn(b, hkv, skv, dqk, device=dev, dtype=torch.bfloat16)
v = torch.randn(b, hkv, skv, dv, device=dev, dtype=torch.bfloat16)
do = torch.randn(b, h, sq, dv, device=dev, dtype=torch.bfloat16)
sizes = dict(B=b, H=h, Hkv=hkv, Sq=sq, Skv=skv)
leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
    out = F.scaled_dot_product_attention(*leaves, is_causal=w["causal"], scale=1 / math.sqrt(dqk),
                                         enable_gqa=hkv != h)
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
