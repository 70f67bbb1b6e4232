"""Sigmoid d128 in the harness: the default (abl/O) against its non-persistent form (abl/P) under four timing methods (bench/NOTES.md session 70 item 5)."""
import os, sys
sys.path.insert(0, os.path.join(os.getcwd(), "bench"))
sys.argv = [sys.argv[0], "abl/O"]
import torch, triton
import ab_rounds
g, w, runs, _ = ab_rounds.forward_case("regime", "sigmoid-b8-h32-s2048-d128", ["abl/O", "abl/P"])
builds, _ = ab_rounds.forward_builds(g, "regime", "sigmoid-b8-h32-s2048-d128", ["abl/O", "abl/P"])
sizes = dict(B=w["b"], H=w["h"], Hkv=w["hkv"], Sq=w["sq"], Skv=w["skv"])
sets = []
for i in range(3):
    q, k, v, _ = g.backward_inputs(w)
    sets.append((q.contiguous(), k.contiguous(), v.contiguous()))
cu = g.workload_customs(w)
for rnd in range(3):
    for d, fk in builds.items():
        q, k, v = sets[0]
        t_db = triton.testing.do_bench(lambda: fk(q, k, v, cu, sizes), warmup=25, rep=200, return_mode="median")
        t_g1 = g.bench_graph(lambda i: fk(*sets[0], cu, sizes), 1, calls=12, replays=9)
        t_g3 = g.bench_graph(lambda i: fk(*sets[i], cu, sizes), 3, calls=12, replays=9)
        t_db3 = triton.testing.do_bench(lambda: [fk(*s, cu, sizes) for s in sets], warmup=25, rep=200, return_mode="median") / 3
        print(f"round {rnd} {d}: do_bench {t_db*1e3:7.1f} us | graph same inputs {t_g1*1e3:7.1f} | graph 3 sets {t_g3*1e3:7.1f} | do_bench of 3 back to back {t_db3*1e3:7.1f}", flush=True)
