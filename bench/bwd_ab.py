"""A/B of backward builds in rotated rounds, on a GPU machine.

    python bench/bwd_ab.py <workload> <rounds> <cases_dir> [<cases_dir> ...] [--no-check]

Each <cases_dir> comes from `aec-bench <cases_dir> --nvrtc --workloads
<workload>` on a different build (copy shared/reference/workloads.json into
it). On the same random inputs (the forward of the first build gives O and
the row state), each build's three backward kernels run once and their dQ,
dK and dV are compared with cuDNN's backward (SDPA's cuDNN backend,
autograd.grad on a kept forward); then, per round, cuDNN's backward and each
build's backward (all three kernels, and the main kernel alone) are timed
(median of do_bench), the builds in an order rotated every round, so that
builds a few percent apart are compared within one process. Prints per
implementation the median over rounds and every round. Custom inputs
(RetNet's decays) are drawn as the benchmark draws them; for variants other
than softmax (no cuDNN), the first build's gradients are the reference and
no cuDNN row is timed. `--no-check` times builds whose gradients disagree
(timing-only ablations) instead of stopping.
"""
import json, os, sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    sys.path.insert(0, HERE)
    import ab_rounds
    wl_id, rounds, dirs, check = ab_rounds.command_line(__doc__)
    import torch
    import gpu_check as g
    torch.zeros(1, device="cuda")
    builds, w, fwd = {}, None, None
    for d in dirs:
        index = json.load(open(os.path.join(d, "index.json")))
        by_id = g.workloads_by_id(d, index)
        entries = {e["workload"]: e for e in index["bench"]}
        entry = entries.get(wl_id)
        if entry is None or "backward" not in entry or not entry["backward"].get("cubin"):
            sys.exit(f"bwd_ab: no backward kernel for `{wl_id}` in {d} (have: {', '.join(entries)})")
        if w is None:
            w = by_id[wl_id]
            fwd = g.Kernel(d, entry["kernel"])
        builds[d] = (g.BackwardKernel(d, entry["backward"]), entry["backward"]["launches"][1]["name"])
    sizes = dict(B=w["b"], H=w["h"], Hkv=w["hkv"], Sq=w["sq"], Skv=w["skv"])
    q, k, v, do = g.backward_inputs(w)
    cu = g.workload_customs(w)
    o, rowout = fwd(q, k, v, cu, sizes)
    anchor = w["variant"] == "softmax" and not w.get("window")
    if anchor:
        out, leaves = g.cudnn_kept_forward(w, q, k, v)
        ref = [x.float() for x in torch.autograd.grad(out, leaves, do, retain_graph=True)]
        against = "cuDNN"
    else:
        ref = [x.float().clone() for x in builds[dirs[0]][0](q, k, v, o, do, rowout, cu, sizes)[:3]]
        against = dirs[0]
    for d, (bk, name) in builds.items():
        got = bk(q, k, v, o, do, rowout, cu, sizes)
        err = max(g.rel_err(x.float(), y) for x, y in zip(got[:3], ref))
        print(f"{d}: {name}  rel. error against {against} {err:.2e}", flush=True)
        if check and not err < 2e-2:
            sys.exit(f"bwd_ab: {d} disagrees with {against}")

    timed = ab_rounds.timed
    times = {"cudnn": []} if anchor else {}
    for d in dirs:
        times[d] = []
        times[d + " main"] = []
    for r in range(rounds):
        if anchor:
            times["cudnn"].append(timed(lambda: torch.autograd.grad(out, leaves, do, retain_graph=True)))
        for d in ab_rounds.rotated(dirs, r):
            bk = builds[d][0]
            times[d].append(timed(lambda bk=bk: bk(q, k, v, o, do, rowout, cu, sizes)))
            times[d + " main"].append(timed(lambda bk=bk: bk(q, k, v, o, do, rowout, cu, sizes, only=1)))
    fl = 2.5 * g.flops_fwd(w)
    ab_rounds.report(wl_id, times, "cudnn" if anchor else dirs[0], "cudnn" if anchor else "first", fl)


if __name__ == "__main__":
    main()
