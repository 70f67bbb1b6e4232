"""A/B of decoding builds in interleaved rounds, on a GPU machine.

    python bench/decode_ab.py <workload> <rounds> <cases_dir> [<cases_dir> ...] [--tiles tag,tag] [--parts]

Each <cases_dir> comes from `aec-bench <cases_dir> --nvrtc --workloads
<workload>` on a different build (copy shared/reference/workloads.json into
it). The workload's default kernel of every build and cuDNN (SDPA's cuDNN
backend) run on the same random inputs: each output's relative error
against cuDNN's is printed, then each is timed as CUDA-graph replays
(gpu_check.bench_graph: 24 calls over rotating input sets larger than L2)
once per round, in the same order every round, so that builds a few tenths
of a percent apart are compared within one process and not across runs.
Prints per build the median over rounds, every round, and the fraction of
the copy bandwidth (q, k and v bytes over the time, against a 1 GiB
device-to-device copy; gpu_check.py also counts o). `--tiles` adds the
benchmark's named tiles (`aec-bench`'s tags) of every build to the rounds.
Plain softmax decoding workloads (the anchor is cuDNN's SDPA) and latent-
cache decoding (`mla_decode`, V the first Dv columns of K's one cache: the
anchor is torch.compile of the eager GEMMs, errors against their f32 form).
`--parts` adds, for every kernel with a split-KV combine kernel, its main
kernel alone (`:main`, the combine launch left out) and its combine kernel
alone (`:combine`, reading an earlier call's partial rows) to the rounds:
where a call's time goes between the two and their boundary.
"""
import json, math, os, sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    args = sys.argv[1:]
    tiles = []
    parts = "--parts" in args
    if parts:
        args.remove("--parts")
    if "--tiles" in args:
        at = args.index("--tiles")
        if at + 1 >= len(args):
            sys.exit(__doc__)
        tiles = args[at + 1].split(",")
        del args[at:at + 2]
    if len(args) < 3 or not args[1].isdigit() or int(args[1]) < 1:
        sys.exit(__doc__)
    wl_id, rounds, dirs = args[0], int(args[1]), args[2:]
    # gpu_check reads its own command line at import.
    sys.argv = [sys.argv[0], dirs[0]]
    sys.path.insert(0, HERE)
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel, SDPBackend
    import gpu_check as g
    torch.zeros(1, device="cuda")  # PyTorch's context, which our modules load into
    kernels = {}
    w = None
    for d in dirs:
        index = json.load(open(os.path.join(d, "index.json")))
        by_id = g.workloads_by_id(d, index)
        entries = {e["workload"]: e for e in index["bench"]}
        if wl_id not in by_id or wl_id not in entries or "kernel" not in entries[wl_id]:
            sys.exit(f"decode_ab: no benchmark kernel for `{wl_id}` in {d} (have: {', '.join(entries)})")
        if w is None:
            w = by_id[wl_id]
            plain = w["variant"] == "softmax" and not w.get("v_in_k")
            if w["sq"] != 1 or not (plain or (w["variant"] == "mla_decode" and w.get("v_in_k"))):
                sys.exit(f"decode_ab: `{wl_id}` is neither a plain softmax nor a latent-cache decoding workload")
        kernels[d] = (g.Kernel(d, entries[wl_id]["kernel"]), entries[wl_id]["kernel"])
        by_tag = {t["tiles"]: t for t in entries[wl_id].get("tiles", []) if "kernel" in t}
        for tag in tiles:
            if tag not in by_tag:
                sys.exit(f"decode_ab: no tile `{tag}` for `{wl_id}` in {d} (have: {', '.join(by_tag)})")
            kernels[f"{d}:{tag}"] = (g.Kernel(d, by_tag[tag]["kernel"]), by_tag[tag]["kernel"])
    b, h, hkv, sq, skv, dqk, dv = w["b"], w["h"], w["hkv"], w["sq"], w["skv"], w["dqk"], w["dv"]
    sizes = dict(B=b, H=h, Hkv=hkv, Sq=sq, Skv=skv)
    torch.manual_seed(0)

    latent = bool(w.get("v_in_k"))

    def inputs():
        q = torch.randn(b, h, sq, dqk, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, hkv, skv, dqk, device="cuda", dtype=torch.bfloat16)
        # The latent cache's V is K's first Dv columns (one cache).
        v = k[..., :dv] if latent else torch.randn(b, hkv, skv, dv, device="cuda", dtype=torch.bfloat16)
        return q, k, v
    sets = [inputs()]
    per_set = sum(t.numel() * t.element_size() for t in sets[0][:2]) + (0 if latent else sets[0][2].numel() * 2)
    while len(sets) * per_set < g.GRAPH_SET_BYTES:
        sets.append(inputs())
    scale = w.get("scale", 1 / math.sqrt(dqk))

    def cudnn(q, k, v):
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=hkv != h)

    def eager(q, k, v, dtype=torch.bfloat16):
        # The query heads of a KV head as the rows of one GEMM each.
        qg = q.reshape(b, hkv, h // hkv * sq, dqk).to(dtype)
        p = torch.softmax((qg @ k.to(dtype).transpose(-1, -2)).float() * scale, -1).to(dtype)
        return (p @ v.to(dtype)).reshape(b, h, sq, dv)
    if latent:
        ref = eager(*sets[0], dtype=torch.float32)
        impls = {"torch.compile": torch.compile(eager)}
    else:
        ref = cudnn(*sets[0]).float()
        impls = {"cudnn": cudnn}
    def caller(kn, skip=None):
        """A call of kernel `kn` with its `skip` launch left out (gpu_check.Kernel.skip_launch;
        graph capture records the launches made while it is set). The latent kernels read V
        from k's rows: k is passed as v too."""
        def call(q, k, v):
            kn.skip_launch = skip
            try:
                return kn(q, k, k if latent else v, {}, sizes)
            finally:
                kn.skip_launch = None
        return call
    for d, (kern, meta) in kernels.items():
        o, _ = caller(kern)(*sets[0])
        torch.cuda.synchronize()
        print(f"{d}: {meta['name']}, {kern.last_splits} KV splits, rel_err {g.rel_err(o.float(), ref):.2e}, "
              f"ptxas {' '.join(meta.get('ptxas') or [])}", flush=True)
        impls[d] = caller(kern)
        if parts and kern.combine is not None and kern.last_splits > 1:
            impls[f"{d}:main"] = caller(kern, "combine")
            impls[f"{d}:combine"] = caller(kern, "main")
    copy_gbps = g.copy_bandwidth()
    times = {n: [] for n in impls}
    for _ in range(rounds):
        for n, f in impls.items():
            times[n].append(g.bench_graph(lambda i, f=f: f(*sets[i]), len(sets)) * 1e3)
    width = max(len(n) for n in impls)
    for n, xs in times.items():
        med = sorted(xs)[len(xs) // 2]
        frac = per_set / (med * 1e-6) / (copy_gbps * 1e9)
        print(f"{n:{width}s}  median {med:9.3f} us  {frac:.3f} of copy  rounds {' '.join(f'{x:.2f}' for x in xs)}", flush=True)


if __name__ == "__main__":
    main()
