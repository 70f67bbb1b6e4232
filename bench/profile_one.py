"""Runs one forward kernel of the forward sweep (`aec-bench … --fwd-sweep`)
a few times on its workload's shape, for a profiler:

    ncu --set full -k regex:aec_fwd --launch-skip 2 --launch-count 1 \
        python bench/profile_one.py bench/cases <config>
"""
import json, os, sys
import torch

sys.path.insert(0, os.path.dirname(__file__))
from gpu_check import Kernel, dev  # noqa: E402

cases_dir, config = sys.argv[1], sys.argv[2]
index = json.load(open(os.path.join(cases_dir, "index.json")))
workloads = {w["id"]: w for w in json.load(open(os.path.join(cases_dir, "workloads.json")))["workloads"]}
entry = next(e for e in index["fwd_sweep"] if e["config"] == config)
w = workloads[entry["workload"]]
q = torch.randn(w["b"], w["h"], w["sq"], w["dqk"], device=dev, dtype=torch.bfloat16)
k = torch.randn(w["b"], w["hkv"], w["skv"], w["dqk"], device=dev, dtype=torch.bfloat16)
v = torch.randn(w["b"], w["hkv"], w["skv"], w["dv"], device=dev, dtype=torch.bfloat16)
kern = Kernel(cases_dir, entry["kernel"])
sizes = dict(B=w["b"], H=w["h"], Hkv=w["hkv"], Sq=w["sq"], Skv=w["skv"])
for _ in range(4):
    kern(q, k, v, {}, sizes)
torch.cuda.synchronize()
print("ran", entry["kernel"]["name"], "on", entry["workload"])
