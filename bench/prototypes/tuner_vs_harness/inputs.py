"""Sigmoid d128 in the harness: abl/O against abl/P on randn, uniform [-1, 1) and uniform [0.5, 1) inputs (bench/NOTES.md session 70 item 5)."""
import os, sys
sys.path.insert(0, os.path.join(os.getcwd(), "bench"))
sys.argv = [sys.argv[0], "abl/O"]
import torch, triton
import ab_rounds
g, w, runs, _ = ab_rounds.forward_case("regime", "sigmoid-b8-h32-s2048-d128", ["abl/O", "abl/P"])
builds, _ = ab_rounds.forward_builds(g, "regime", "sigmoid-b8-h32-s2048-d128", ["abl/O", "abl/P"])
sizes = dict(B=w["b"], H=w["h"], Hkv=w["hkv"], Sq=w["sq"], Skv=w["skv"])
q, k, v, _ = g.backward_inputs(w)
print("randn-like inputs: std", float(q.float().std()), "mean", float(q.float().mean()))
uq, uk, uv = [(torch.rand_like(t, dtype=torch.float32) * 2 - 1).to(torch.bfloat16).contiguous() for t in (q, k, v)]
zq, zk, zv = [(torch.rand_like(t, dtype=torch.float32) * 0.5 + 0.5).to(torch.bfloat16).contiguous() for t in (q, k, v)]
cu = g.workload_customs(w)
for rnd in range(3):
    for d, fk in builds.items():
        res = []
        for name, (a, b, c) in (("randn", (q, k, v)), ("uniform[-1,1)", (uq, uk, uv)), ("uniform[0.5,1)", (zq, zk, zv))):
            t = triton.testing.do_bench(lambda: fk(a, b, c, cu, sizes), warmup=25, rep=200, return_mode="median")
            res.append(f"{name} {t*1e3:7.1f}")
        print(f"round {rnd} {d}: " + " | ".join(res), flush=True)
