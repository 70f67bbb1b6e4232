"""GPU check and benchmark of aec's recurrent (chunked) kernels.

    python bench/recurrent_check.py <cases_dir> [--no-bench] [--only id,id]

<cases_dir> is what `aec-bench <cases_dir> --nvcc …` wrote (its index.json's
`recurrent_cases` and `recurrent_bench`). Each case runs our forward on the
case's bf16 inputs (with its initial state, if any) and compares the output,
the final state and the final normaliser with the f64 reference
interpreter's. The benchmark times our forward next to flash-linear-attention
(fla-core 0.6.0; install its wheel first) on the recurrent workloads of
workloads.json, in one process with the same timing method (triton's
do_bench, median), and cross-checks our output against fla's. Results go to
$OUT/recurrent.json.
"""
import ctypes, datetime, json, math, os, sys
import torch
import torch.nn.functional as F

from gpu_check import OUT, bench, check, dev, get_function, libcuda, load_bin, load_module, rel_err


class RecurrentKernel:
    """A generated recurrent forward loaded from its cubin."""

    def __init__(self, cases_dir, meta):
        self.meta = meta
        self.module = load_module(cases_dir, meta["cubin"])
        self.fn = get_function(self.module, meta["name"], meta["smem_bytes"])

    def __call__(self, q, k, v, customs, state_in=None, norm_in=None, want_state=True):
        b, h, s, dk = q.shape
        dv = v.shape[-1]
        for name, t in (("q", q), ("k", k), ("v", v)):
            assert t.is_contiguous() and t.dtype == torch.bfloat16, f"tensor `{name}` must be contiguous bf16"
        o = torch.empty(b, h, s, dv, device=dev, dtype=torch.bfloat16)
        state_out = torch.empty(b, h, dk, dv, device=dev, dtype=torch.float32) if want_state else None
        norm_out = torch.empty(b, h, dk, device=dev, dtype=torch.float32) if want_state else None
        bufs = dict(q=q, k=k, v=v, o=o, state_in=state_in, state_out=state_out, norm_in=norm_in, norm_out=norm_out)
        sizes = dict(B=b, H=h, S=s)
        vals = []
        for a in self.meta["args"]:
            kind = a["kind"]
            if kind in ("tensor", "state"):
                t = bufs[a["name"]]
                vals.append(ctypes.c_uint64(t.data_ptr() if t is not None else 0))
            elif kind == "custom":
                vals.append(ctypes.c_uint64(customs[a["name"]].data_ptr()))
            else:
                vals.append(ctypes.c_int32(sizes[a["axis"]]))
        params = (ctypes.c_void_p * len(vals))(*[ctypes.cast(ctypes.byref(x), ctypes.c_void_p) for x in vals])
        stream = torch.cuda.current_stream().cuda_stream
        grid = (dv // self.meta["dv_tile"], h, b)
        check(libcuda.cuLaunchKernel(self.fn, *grid, self.meta["threads"], 1, 1, self.meta["smem_bytes"],
                                     ctypes.c_void_p(stream), params, None), "cuLaunchKernel")
        return o, state_out, norm_out


def run_cases(cases_dir, index, only):
    rows, ok = [], True
    for c in index.get("recurrent_cases", []):
        if only and c["id"] not in only:
            continue
        cid, s = c["id"], c["sizes"]
        base = os.path.join(cases_dir, cid)
        b, h, sl, dk, dv = s["B"], s["H"], s["S"], s["Dk"], s["Dv"]
        try:
            kern = RecurrentKernel(cases_dir, c["kernel"])
            q = load_bin(base + ".q.bin", torch.bfloat16, [b, h, sl, dk])
            k = load_bin(base + ".k.bin", torch.bfloat16, [b, h, sl, dk])
            v = load_bin(base + ".v.bin", torch.bfloat16, [b, h, sl, dv])
            customs = {x["name"]: load_bin(f"{base}.in_{x['name']}.bin", torch.float32, x["shape"]) for x in c["customs"]}
            state_in = load_bin(base + ".state_in.bin", torch.float32, [b, h, dk, dv]) if c["initial_state"] else None
            norm_in = (load_bin(base + ".norm_in.bin", torch.float32, [b, h, dk])
                       if c["initial_state"] and c["normalized"] else None)
            o, st, nz = kern(q, k, v, customs, state_in, norm_in)
            torch.cuda.synchronize()
            err_o = rel_err(o.float(), load_bin(base + ".o_ref.bin", torch.float32, [b, h, sl, dv]))
            err_s = rel_err(st, load_bin(base + ".state_ref.bin", torch.float32, [b, h, dk, dv]))
            err_n = rel_err(nz, load_bin(base + ".norm_ref.bin", torch.float32, [b, h, dk])) if c["normalized"] else 0.0
            nan = bool(torch.isnan(o.float()).any().item() or torch.isnan(st).any().item())
            passed = max(err_o, err_s, err_n) < 1e-2 and not nan
            ok &= passed
            print(f"check {cid:14s} {'PASS' if passed else 'FAIL'} rel_err(o)={err_o:.2e} rel_err(state)={err_s:.2e} "
                  f"rel_err(norm)={err_n:.2e} nan={nan} sizes={s} initial_state={c['initial_state']}", flush=True)
            rows.append(dict(case=cid, variant=c["variant"], rel_err_o=err_o, rel_err_state=err_s, rel_err_norm=err_n,
                             nan=nan, passed=passed, sizes=s, initial_state=c["initial_state"],
                             ptxas=c["kernel"].get("ptxas")))
        except Exception as e:  # a failure is a row, never a silent skip
            ok = False
            print(f"check {cid:14s} FAIL {type(e).__name__}: {e}", flush=True)
            rows.append(dict(case=cid, passed=False, error=f"{type(e).__name__}: {e}"))
    return ok, rows


def flops(w):
    """The anchors' count (shared/reference/anchors_bench.py): intra-chunk
    2·B·H·S·64·(Dk+Dv) plus inter-chunk 4·B·H·S·Dk·Dv."""
    b, h, s, dk, dv = w["b"], w["h"], w["sq"], w["dqk"], w["dv"]
    return 2.0 * b * h * s * 64 * (dk + dv) + 4.0 * b * h * s * dk * dv


def run_bench(cases_dir, index, workloads):
    rows = []
    wl = {w["id"]: w for w in workloads["workloads"]}

    def record(work, impl, ms, fl, pas="fwd", err=None, error=None, config=None):
        row = dict(workload=work, **{"pass": pas}, impl=impl)
        if config:
            row["config"] = config
        if error is not None:
            row["error"] = error
            print(f"bench {work:44s} {pas:7s} {impl:22s} ERROR {error}", flush=True)
        else:
            row.update(ms=ms, tflops=fl / (ms * 1e-3) / 1e12)
            if err is not None:
                row["rel_err_vs_fla"] = err
            print(f"bench {work:44s} {pas:7s} {impl:22s} {ms:8.4f} ms {row['tflops']:7.1f} TF/s"
                  + (f" err_vs_fla={err:.2e}" if err is not None else ""), flush=True)
        rows.append(row)

    try:
        from fla.ops.simple_gla import chunk_simple_gla
        from fla.ops.retention import chunk_retention
        fla_error = None
    except Exception as e:
        fla_error = f"{type(e).__name__}: {e}"
    by_work = {}
    for e in index.get("recurrent_bench", []):
        by_work.setdefault(e["workload"], []).append(e)
    for work, entries in by_work.items():
        w = wl[work]
        b, h, s, dk, dv = w["b"], w["h"], w["sq"], w["dqk"], w["dv"]
        fl = flops(w)
        torch.manual_seed(0)
        # Unit-variance q, k scaled like the anchors' (0.1) so states stay in range.
        q = (torch.randn(b, h, s, dk, device=dev) * 0.1).to(torch.bfloat16)
        k = (torch.randn(b, h, s, dk, device=dev) * 0.1).to(torch.bfloat16)
        v = torch.randn(b, h, s, dv, device=dev, dtype=torch.bfloat16)
        customs = {}
        # fla's inputs ([B, T, H, ·]) for the same computation.
        tq, tk, tv = (t.transpose(1, 2).contiguous() for t in (q, k, v))
        variant = w["variant"]
        if variant == "retnet_recurrent":
            fla_fn = lambda q_, k_, v_: chunk_retention(q_, k_, v_)[0]
            fla_args = (tq, tk, tv)
        elif variant == "gated_retention":
            customs["gate"] = torch.randn(b, h, s, device=dev, dtype=torch.float32) + 2.0
            g = (F.logsigmoid(customs["gate"]) / 16).transpose(1, 2).contiguous()
            fla_fn = lambda q_, k_, v_: chunk_simple_gla(q_, k_, v_, g, scale=dk ** -0.5)[0]
            fla_args = (tq, tk, tv)
        elif variant == "mamba2":
            customs["a"] = -torch.empty(h, device=dev).uniform_(1.0, 16.0)
            customs["dt"] = torch.empty(b, h, s, device=dev).uniform_(0.001, 0.1)
            g = (customs["dt"] * customs["a"][None, :, None]).transpose(1, 2).contiguous()
            tvd = (v.float() * customs["dt"][..., None]).to(torch.bfloat16).transpose(1, 2).contiguous()
            fla_fn = lambda q_, k_, v_: chunk_simple_gla(q_, k_, v_, g, scale=1.0)[0]
            fla_args = (tq, tk, tvd)
        else:
            raise ValueError(variant)
        ref = None
        if fla_error:
            record(work, "fla", None, fl, error=fla_error)
        else:
            try:
                ref = fla_fn(*fla_args).transpose(1, 2).float()
                record(work, "fla", bench(lambda: fla_fn(*fla_args)), fl)
                leaves = [t.detach().clone().requires_grad_() for t in fla_args]
                do = torch.randn_like(fla_args[2])

                def fb():
                    return torch.autograd.grad(fla_fn(*leaves), leaves, do)
                fb()
                record(work, "fla", bench(fb), 3 * fl, pas="fwd+bwd")
            except Exception as e:
                record(work, "fla", None, fl, error=f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")
        for e in entries:
            impl = "aec" if e.get("default") else "aec " + e.get("config", "")
            if "error" in e:
                record(work, impl, None, fl, error=e["error"])
                continue
            try:
                kern = RecurrentKernel(cases_dir, e["kernel"])
                o, _, _ = kern(q, k, v, customs, want_state=False)
                torch.cuda.synchronize()
                err = rel_err(o.float(), ref) if ref is not None else None
                record(work, impl, bench(lambda: kern(q, k, v, customs, want_state=False)), fl, err=err,
                       config=e.get("config"))
            except Exception as ex:
                record(work, impl, None, fl, error=f"{type(ex).__name__}: {ex}")
        record(work, "aec", None, 3 * fl, pas="fwd+bwd", error="no recurrent backward kernel yet")
        del q, k, v, tq, tk, tv
        torch.cuda.empty_cache()
    return rows


def main():
    args = sys.argv[1:]
    cases_dir = args[0]
    only = set(args[args.index("--only") + 1].split(",")) if "--only" in args else None
    index = json.load(open(os.path.join(cases_dir, "index.json")))
    torch.zeros(1, device=dev)
    ok, checks = run_cases(cases_dir, index, only)
    rows = []
    if "--no-bench" not in args:
        workloads = json.load(open(os.path.join(cases_dir, "workloads.json")))
        rows = run_bench(cases_dir, index, workloads)
    result = dict(device=torch.cuda.get_device_name(), date=datetime.date.today().isoformat(),
                  commit=os.environ.get("AEC_COMMIT", "unknown"),
                  command="python bench/recurrent_check.py " + " ".join(args),
                  torch=torch.__version__, checks=checks, rows=rows)
    with open(os.path.join(OUT, "recurrent.json"), "w") as fh:
        json.dump(result, fh, indent=1)
    print("all recurrent checks passed" if ok else "SOME RECURRENT CHECKS FAILED", flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
