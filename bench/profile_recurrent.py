"""Runs one recurrent forward of the benchmark (`aec-bench … --recurrent-only`)
a few times on its workload's shape, for a profiler:

    ncu --set full -k regex:aec_rec --launch-skip 2 --launch-count 1 \
        python bench/profile_recurrent.py bench/cases <workload> [config]

`config` is a benchmark tag (`c64v64w`, `c64v32s2b2`, …); the default
configuration without one.
"""
import json, os, sys
import torch

sys.path.insert(0, os.path.dirname(__file__))
from gpu_check import dev  # noqa: E402
from recurrent_check import RecurrentKernel  # noqa: E402

cases_dir, work = sys.argv[1], sys.argv[2]
config = sys.argv[3] if len(sys.argv) > 3 else None
index = json.load(open(os.path.join(cases_dir, "index.json")))
w = {x["id"]: x for x in json.load(open(os.path.join(cases_dir, "workloads.json")))["workloads"]}[work]
entry = next(e for e in index["recurrent_bench"] if e.get("workload") == work and "kernel" in e
             and (e.get("config") == config if config else e.get("default")))
b, h, s, dk, dv = w["b"], w["h"], w["sq"], w["dqk"], w["dv"]
q = (torch.randn(b, h, s, dk, device=dev) * 0.1).to(torch.bfloat16)
k = (torch.randn(b, h, s, dk, device=dev) * 0.1).to(torch.bfloat16)
v = torch.randn(b, h, s, dv, device=dev, dtype=torch.bfloat16)
customs = {}
if w["variant"] == "gated_retention":
    customs["gate"] = torch.randn(b, h, s, device=dev) + 2.0
elif w["variant"] == "mamba2":
    customs["a"] = -torch.empty(h, device=dev).uniform_(1.0, 16.0)
    customs["dt"] = torch.empty(b, h, s, device=dev).uniform_(0.001, 0.1)
kern = RecurrentKernel(cases_dir, entry["kernel"])
for _ in range(4):
    kern(q, k, v, customs, want_state=False)
torch.cuda.synchronize()
print("ran", entry["kernel"]["name"], "on", work)
