"""Runs one forward kernel a few times on its workload's shape, for a
profiler: a configuration of the forward sweep (`aec-bench … --fwd-sweep`),
or with `--bench` the benchmark kernel of a workload (`index.json`'s
`bench`, the workload from workloads.json or `extra_workloads`; `--tile
TAG` one of its other tiles instead of the default); with `--cudnn` also
cuDNN's SDPA on the same tensors (to profile the anchor):

    ncu --set full -k regex:aec_fwd --launch-skip 2 --launch-count 1 \\
        python bench/profile_one.py bench/cases <config>
    ncu --section SpeedOfLight -k regex:'aec_fwd|cudnn' \\
        python bench/profile_one.py bench/cases --bench <workload> --cudnn
"""
import json, math, os, sys
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from gpu_check import Kernel, dev  # noqa: E402

cases_dir = sys.argv[1]
index = json.load(open(os.path.join(cases_dir, "index.json")))
workloads = {w["id"]: w for w in json.load(open(os.path.join(cases_dir, "workloads.json")))["workloads"]}
workloads.update({w["id"]: w for w in index.get("extra_workloads", [])})
if sys.argv[2] == "--bench":
    entry = next(e for e in index["bench"] if e["workload"] == sys.argv[3])
else:
    entry = next(e for e in index["fwd_sweep"] if e["config"] == sys.argv[2])
w = workloads[entry["workload"]]
q = torch.randn(w["b"], w["h"], w["sq"], w["dqk"], device=dev, dtype=torch.bfloat16)
k = torch.randn(w["b"], w["hkv"], w["skv"], w["dqk"], device=dev, dtype=torch.bfloat16)
v = k if w.get("v_in_k") else torch.randn(w["b"], w["hkv"], w["skv"], w["dv"], device=dev, dtype=torch.bfloat16)
meta = entry["kernel"]
if "--tile" in sys.argv:
    tag = sys.argv[sys.argv.index("--tile") + 1]
    meta = next(t["kernel"] for t in entry["tiles"] if t["tiles"] == tag)
kern = Kernel(cases_dir, meta)
sizes = dict(B=w["b"], H=w["h"], Hkv=w["hkv"], Sq=w["sq"], Skv=w["skv"])
for _ in range(4):
    kern(q, k, v, {}, sizes)
if "--cudnn" in sys.argv:
    from torch.nn.attention import sdpa_kernel, SDPBackend
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        for _ in range(4):
            F.scaled_dot_product_attention(q, k, v, is_causal=w.get("causal", False), scale=1 / math.sqrt(w["dqk"]),
                                           enable_gqa=w["hkv"] != w["h"])
torch.cuda.synchronize()
print("ran", meta["name"], "on", entry["workload"])
