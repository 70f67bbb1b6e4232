"""GPU check and benchmark of aec's recurrent (chunked) kernels.

    python bench/recurrent_check.py <cases_dir> [--no-bench] [--fwd-only] [--default-only] [--only id,id]

<cases_dir> is what `aec-bench <cases_dir> --nvrtc` (or `--nvcc …`) wrote (its index.json's
`recurrent_cases` and `recurrent_bench`). Each case runs our forward on the
case's bf16 inputs (with its initial state, if any) and compares the output,
the final state and the final normaliser with the f64 reference
interpreter's. The benchmark times our forward, and our forward+backward,
next to flash-linear-attention (fla-core 0.6.0; install its wheel first) and a
chunked PyTorch implementation with autograd (`torch_chunked`, the anchor
where fla's backward refuses to run) on the recurrent workloads of
workloads.json, in one process with the same timing method (triton's
do_bench, median); it cross-checks our output against fla's and our gradients
(q, k, v and the custom inputs) against PyTorch autograd in f32, and times
each backward kernel alone (`--fwd-only`: the forward rows only;
`--default-only`: the default configuration only, not the `mma.sync` tile
space the benchmark also sweeps). Results go
to $OUT/recurrent.json.
"""
import ctypes, datetime, json, math, os, sys
import torch
import torch.nn.functional as F

from gpu_check import OUT, bench, check, dev, get_function, libcuda, load_bin, load_module, rel_err


MIN_SEGMENT_CHUNKS, MAX_SEGMENTS = 4, 16


def segment_split(chains, chunks, sms):
    """(whole, tail, segments): SegmentSplit::for_launch of
    compiler/src/cuda/recurrent_wgmma.rs, which the Rust runtime uses."""
    tail = chains % sms
    if tail == 0:
        return chains, 0, 1
    segments = min(sms // tail, chunks // MIN_SEGMENT_CHUNKS, MAX_SEGMENTS)
    if segments < 2:
        return chains, 0, 1
    return chains - tail, tail, segments


class RecurrentKernel:
    """A generated recurrent forward loaded from its cubin; `whole`: walk
    every chain whole even where the kernel can run segments."""

    def __init__(self, cases_dir, meta, whole=False):
        self.meta = meta
        self.module = load_module(cases_dir, meta["cubin"])
        self.fn = get_function(self.module, meta["name"], meta["smem_bytes"])
        self.whole = whole or not meta.get("segments", False)
        self.sms = torch.cuda.get_device_properties(dev).multi_processor_count

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
        slices = dv // self.meta["dv_tile"]
        grid = (slices, h, b)
        whole, tail, n_seg = slices * h * b, 0, 1
        if not self.whole:
            whole, tail, n_seg = segment_split(slices * h * b, -(-s // self.meta["chunk"]), self.sms)
        if n_seg > 1:
            # The schedule's counter and flags start at zero each launch.
            published = tail * (n_seg - 1)  # segments run for the state alone
            bufs["sched"] = torch.zeros(1 + published, device=dev, dtype=torch.int32)
            bufs["carry"] = torch.empty(published * (2 * self.meta["dk"] * 64 + 1), device=dev, dtype=torch.float32)
            grid = (whole + tail * n_seg + published, 1, 1)
        segs = dict(n_whole=whole, n_tail=tail, n_seg=n_seg)
        vals = []
        for a in self.meta["args"]:
            kind = a["kind"]
            if kind in ("tensor", "state", "workspace"):
                t = bufs.get(a["name"])
                vals.append(ctypes.c_uint64(t.data_ptr() if t is not None else 0))
            elif kind == "custom":
                vals.append(ctypes.c_uint64(customs[a["name"]].data_ptr()))
            elif kind == "cu_seqlens":
                vals.append(ctypes.c_uint64(0))  # equal lengths: B sequences of S steps
            elif kind == "segments":
                vals.append(ctypes.c_int32(segs[a["name"]]))
            else:
                vals.append(ctypes.c_int32(sizes[a["axis"]]))
        params = (ctypes.c_void_p * len(vals))(*[ctypes.cast(ctypes.byref(x), ctypes.c_void_p) for x in vals])
        stream = torch.cuda.current_stream().cuda_stream
        check(libcuda.cuLaunchKernel(self.fn, *grid, self.meta["threads"], 1, 1, self.meta["smem_bytes"],
                                     ctypes.c_void_p(stream), params, None), "cuLaunchKernel")
        return o, state_out, norm_out


def launch(fn, meta, grid, vals):
    params = (ctypes.c_void_p * len(vals))(*[ctypes.cast(ctypes.byref(x), ctypes.c_void_p) for x in vals])
    stream = torch.cuda.current_stream().cuda_stream
    check(libcuda.cuLaunchKernel(fn, *grid, meta["threads"], 1, 1, meta["smem_bytes"], ctypes.c_void_p(stream),
                                 params, None), "cuLaunchKernel " + meta["name"])


class RecurrentBackward:
    """A generated recurrent backward (states pass + backward kernels) loaded from its cubins."""

    def __init__(self, cases_dir, meta):
        self.meta = meta
        st = meta["states"]
        self.states_fn = get_function(load_module(cases_dir, st["cubin"]), st["name"], st["smem_bytes"])
        module = load_module(cases_dir, meta["cubin"])
        self.fns = [(k, get_function(module, k["name"], k["smem_bytes"])) for k in meta["kernels"]]

    def __call__(self, q, k, v, customs, do):
        b, h, s, dk = q.shape
        dv = v.shape[-1]
        nc = (s + self.meta["chunk"] - 1) // self.meta["chunk"]
        norm, decay = self.meta["normalized"], self.meta["decay"]
        e, f = dict(device=dev, dtype=q.dtype), dict(device=dev, dtype=torch.float32)
        bufs = dict(q=q, k=k, v=v, do=do,
                    states=torch.empty(b, h, nc, dk, dv, **e), dstates=torch.empty(b, h, nc, dk, dv, **e),
                    dq=torch.empty_like(q), dk=torch.empty_like(k), dv=torch.empty_like(v))
        if norm:
            bufs.update(norm_states=torch.empty(b, h, nc, dk, **f), dnorm_states=torch.empty(b, h, nc, dk, **f),
                        o_raw=torch.empty(b, h, s, dv, **e), dob=torch.empty(b, h, s, dv, **e),
                        row_n=torch.empty(b, h, s, **f), dn=torch.empty(b, h, s, **f))
        if decay:
            bufs.update(dlog=torch.zeros(b, h, s, **f))
        grads = {n: torch.zeros_like(t) for n, t in customs.items()}
        alias = dict(o="o_raw", state_out="final_state", norm_out="final_norm")
        sizes = dict(B=b, H=h, S=s)

        def values(args):
            vals = []
            for a in args:
                kind = a["kind"]
                if kind == "size":
                    vals.append(ctypes.c_int32(sizes[a["axis"]]))
                    continue
                if kind == "custom":
                    t = customs[a["name"]]
                elif kind == "custom_grad":
                    t = grads[a["name"]]
                elif kind == "cu_seqlens":
                    t = None  # equal lengths: B sequences of S steps
                else:
                    t = bufs.get(alias.get(a["name"], a["name"]))
                vals.append(ctypes.c_uint64(t.data_ptr() if t is not None else 0))
            return vals

        st = self.meta["states"]
        states_vals, vals = values(st["args"]), values(self.meta["args"])
        grids = []
        for kmeta, fn in self.fns:
            kind, n = kmeta["grid_x"]
            grids.append(({"dv_slices": dv // n, "chunks": nc * n, "rows": (s + n - 1) // n, "one": 1}[kind], h, b))

        def launch_one(i):  # -1: the states pass
            if i < 0:
                launch(self.states_fn, st, (dv // st["dv_tile"], h, b), states_vals)
            else:
                launch(self.fns[i][1], self.fns[i][0], grids[i], vals)
        self.launch_one, self.keep = launch_one, (bufs, grads)
        for i in range(-1, len(self.fns)):
            launch_one(i)
        return bufs["dq"], bufs["dk"], bufs["dv"], grads


def torch_chunked(q, k, v, logg, chunk=64):
    """Chunked linear attention in PyTorch (autograd backward): the anchor where
    flash-linear-attention's backward does not run. q, k: [B, H, S, Dk], v:
    [B, H, S, Dv], logg: [B, H, S] natural-log decay per step; S a multiple of chunk."""
    b, h, s, dk = q.shape
    dv = v.shape[-1]
    n = s // chunk
    q, k, v = (t.reshape(b, h, n, chunk, t.shape[-1]) for t in (q, k, v))
    L = logg.reshape(b, h, n, chunk).float().cumsum(-1)
    mask = torch.ones(chunk, chunk, device=q.device, dtype=torch.bool).tril()
    decay = (L[..., :, None] - L[..., None, :]).masked_fill(~mask, float("-inf")).exp()
    a = ((q @ k.transpose(-1, -2)).float() * decay).to(v.dtype)
    o = (a @ v).float()
    kd = (k.float() * (L[..., -1:] - L).exp()[..., None]).to(k.dtype)
    upd = (kd.transpose(-1, -2) @ v).float()  # [b, h, n, dk, dv]
    state = torch.zeros(b, h, dk, dv, device=q.device, dtype=torch.float32)
    states = []
    for c in range(n):
        states.append(state)
        state = state * L[:, :, c, -1].exp()[..., None, None] + upd[:, :, c]
    S = torch.stack(states, 2).to(q.dtype)
    o = o + ((q.float() * L.exp()[..., None]).to(q.dtype) @ S).float()
    return o.reshape(b, h, s, dv).to(q.dtype)


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


def run_bench(cases_dir, index, workloads, fwd_only=False, default_only=False):
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
    by_work, by_bwd, by_dec = {}, {}, {}
    for e in index.get("recurrent_bench", []):
        if "backward" in e or "backward_error" in e:
            by_bwd[e["workload"]] = e
        elif "decode" in e or "decode_error" in e:
            by_dec[e["workload"]] = e
        else:
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
                if fwd_only:
                    raise StopIteration
                leaves = [t.detach().clone().requires_grad_() for t in fla_args]
                do = torch.randn_like(fla_args[2])

                def fb():
                    return torch.autograd.grad(fla_fn(*leaves), leaves, do)
                fb()
                record(work, "fla", bench(fb), 3 * fl, pas="fwd+bwd")
            except StopIteration:
                pass
            except Exception as e:  # the forward row is in; this is the fwd+bwd attempt
                record(work, "fla", None, 3 * fl, pas="fwd+bwd",
                       error=f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")
        for e in entries:
            if default_only and not e.get("default"):
                continue  # the tile-space sweep is skipped
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
                if e["kernel"].get("segments"):
                    # The same kernel with every chain whole: what the segments gain.
                    whole = RecurrentKernel(cases_dir, e["kernel"], whole=True)
                    chains = dv // e["kernel"]["dv_tile"] * h * b
                    plan = segment_split(chains, -(-s // e["kernel"]["chunk"]), kern.sms)
                    record(work, impl + " whole chains", bench(lambda: whole(q, k, v, customs, want_state=False)),
                           fl, config=f"{e.get('config')} (segments {plan} vs whole)")
            except Exception as ex:
                record(work, impl, None, fl, error=f"{type(ex).__name__}: {ex}")
        if not fwd_only:
            bench_backward(work, w, by_bwd.get(work), cases_dir, q, k, v, customs, fla_fn, fla_args, fla_error, record, fl)
        del q, k, v, tq, tk, tv
        torch.cuda.empty_cache()
        if work in by_dec:
            bench_decode(work, w, by_dec[work], cases_dir, rows)
    return rows


def bench_decode(work, w, entry, cases_dir, rows):
    """One decode step (S = 1) from a state: aec's step kernel (state updated in place) next to fla's
    fused_recurrent kernel (initial state in, final state out), at the workload's batch and at B = 16.
    Both are bound by the f32 state's traffic, so rows report its read+write bandwidth; outputs and new
    states are cross-checked."""
    def record(b, impl, ms=None, err=None, error=None):
        row = dict(workload=work, **{"pass": "decode"}, impl=impl, b=b)
        if error is not None:
            row["error"] = error
            print(f"bench {work:44s} decode  B={b:<3d} {impl:16s} ERROR {error}", flush=True)
        else:
            gbs = 2 * state_bytes / (ms * 1e-3) / 1e9
            row.update(ms=ms, state_gb_per_s=gbs)
            if err is not None:
                row["rel_err_vs_fla"] = err
            print(f"bench {work:44s} decode  B={b:<3d} {impl:16s} {ms * 1e3:8.2f} us {gbs:7.0f} GB/s (state)"
                  + (f" err_vs_fla={err}" if err is not None else ""), flush=True)
        rows.append(row)

    h, dk, dv, variant = w["h"], w["dqk"], w["dv"], w["variant"]
    meta = entry.get("decode")
    fn = get_function(load_module(cases_dir, meta["cubin"]), meta["name"], 0) if meta else None
    for b in sorted({w["b"], 16}):
        state_bytes = b * h * dk * dv * 4
        if "decode_error" in entry:
            record(b, "aec", error=entry["decode_error"])
            continue
        torch.manual_seed(1)
        q = (torch.randn(b, h, 1, dk, device=dev) * 0.1).to(torch.bfloat16)
        k = (torch.randn(b, h, 1, dk, device=dev) * 0.1).to(torch.bfloat16)
        v = torch.randn(b, h, 1, dv, device=dev, dtype=torch.bfloat16)
        state0 = torch.randn(b, h, dk, dv, device=dev) * 0.1
        customs = {}
        tq, tk, tv = (t.transpose(1, 2).contiguous() for t in (q, k, v))
        try:
            if variant == "retnet_recurrent":
                from fla.ops.retention import fused_recurrent_retention
                fla_fn = lambda: fused_recurrent_retention(tq, tk, tv, initial_state=state0, output_final_state=True)
            elif variant == "gated_retention":
                from fla.ops.simple_gla import fused_recurrent_simple_gla
                customs["gate"] = torch.randn(b, h, 1, device=dev) + 2.0
                g = (F.logsigmoid(customs["gate"]) / 16).transpose(1, 2).contiguous()
                fla_fn = lambda: fused_recurrent_simple_gla(tq, tk, tv, g, scale=dk ** -0.5, initial_state=state0,
                                                            output_final_state=True)
            elif variant == "mamba2":
                from fla.ops.simple_gla import fused_recurrent_simple_gla
                customs["a"] = -torch.empty(h, device=dev).uniform_(1.0, 16.0)
                customs["dt"] = torch.empty(b, h, 1, device=dev).uniform_(0.001, 0.1)
                g = (customs["dt"] * customs["a"][None, :, None]).transpose(1, 2).contiguous()
                tvd = (v.float() * customs["dt"][..., None]).to(torch.bfloat16).transpose(1, 2).contiguous()
                fla_fn = lambda: fused_recurrent_simple_gla(tq, tk, tvd, g, scale=1.0, initial_state=state0,
                                                            output_final_state=True)
            else:
                raise ValueError(variant)
            o_ref, s_ref = fla_fn()
            record(b, "fla fused_recurrent", bench(fla_fn))
            o_ref = o_ref.transpose(1, 2).float()
        except Exception as e:
            o_ref = s_ref = None
            record(b, "fla fused_recurrent", error=f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")
        o = torch.empty(b, h, 1, dv, device=dev, dtype=torch.bfloat16)
        state = state0.clone()
        bufs = dict(q=q, k=k, v=v, o=o, state=state)
        vals = []
        for a in meta["args"]:
            if a["kind"] in ("tensor", "state"):
                vals.append(ctypes.c_uint64(bufs[a["name"]].data_ptr()))
            elif a["kind"] == "custom":
                vals.append(ctypes.c_uint64(customs[a["name"]].data_ptr()))
            else:
                vals.append(ctypes.c_int32(dict(B=b, H=h, S=1)[a["axis"]]))
        grid = (meta["grid_x"], h, b)
        launch(fn, meta, grid, vals)
        torch.cuda.synchronize()
        err = None
        if o_ref is not None:
            err = dict(o=round(rel_err(o.float(), o_ref), 6), state=round(rel_err(state, s_ref.float()), 6))
        # Each timed launch steps the state once more; the time does not depend on its values.
        record(b, "aec", bench(lambda: launch(fn, meta, grid, vals)), err=err)
        del q, k, v, o, state, state0
        torch.cuda.empty_cache()


def torch_inputs(variant, q, k, v, customs, dk):
    """(q, k, v, logg) for torch_chunked from our inputs and custom inputs, differentiable in them."""
    b, h, s, _ = q.shape
    if variant == "retnet_recurrent":
        gamma = 1.0 - torch.exp2(-5.0 - torch.arange(h, device=dev, dtype=torch.float32))
        return (q.float() * dk ** -0.5).to(q.dtype), k, v, gamma.log()[None, :, None].expand(b, h, s)
    if variant == "gated_retention":
        return (q.float() * dk ** -0.5).to(q.dtype), k, v, F.logsigmoid(customs["gate"]) / 16
    if variant == "mamba2":
        return q, k, (v.float() * customs["dt"][..., None]).to(v.dtype), customs["dt"] * customs["a"][None, :, None]
    raise ValueError(variant)


def bench_backward(work, w, entry, cases_dir, q, k, v, customs, fla_fn, fla_args, fla_error, record, fl):
    """Rows for aec's fwd+bwd and the chunked PyTorch anchor; cross-checks our gradients (q, k, v and the
    custom inputs) against PyTorch autograd through torch_chunked in f32."""
    dk = q.shape[-1]
    variant = w["variant"]
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    cleaves = {n: t.detach().clone().requires_grad_() for n, t in customs.items()}
    do = torch.randn_like(v)
    try:
        def torch_fb():
            o = torch_chunked(*torch_inputs(variant, *leaves, cleaves, dk))
            return torch.autograd.grad(o, leaves + list(cleaves.values()), do)
        torch_fb()
        record(work, "torch-chunked", bench(torch_fb), 3 * fl, pas="fwd+bwd")
    except Exception as e:
        record(work, "torch-chunked", None, 3 * fl, pas="fwd+bwd", error=f"{type(e).__name__}: {str(e)[:160]}")
    if entry is None or "backward_error" in (entry or {}):
        record(work, "aec", None, 3 * fl, pas="fwd+bwd",
               error=(entry or {}).get("backward_error", "no backward kernel in the cases"))
        return
    try:
        fwd = RecurrentKernel(cases_dir, next(e for e in index_cache["bench"]
                                              if e.get("workload") == work and e.get("default"))["kernel"])
        bwd = RecurrentBackward(cases_dir, entry["backward"])

        def ours():
            fwd(q, k, v, customs, want_state=False)
            return bwd(q, k, v, customs, do)
        got = ours()
        torch.cuda.synchronize()
        # The same gradients through PyTorch autograd in f32 (x64 would not fit).
        f_leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
        f_c = {n: t.detach().clone().requires_grad_() for n, t in customs.items()}
        qq, kk, vv, lg = torch_inputs(variant, *f_leaves, f_c, dk)
        o = torch_chunked(qq, kk, vv, lg)
        want = torch.autograd.grad(o, f_leaves + list(f_c.values()), do.float())
        errs = {n: rel_err(g.float(), wt) for n, g, wt in zip(["dq", "dk", "dv"] + [f"d{c}" for c in f_c],
                                                             list(got[:3]) + [got[3][c] for c in f_c], want)}
        del f_leaves, f_c, qq, kk, vv, lg, o, want
        row_err = max(errs.values())
        print(f"bench {work:44s} backward vs torch autograd (f32): "
              + " ".join(f"{n}={e:.2e}" for n, e in errs.items()), flush=True)
        print(f"bench {work:44s} backward worst gradient rel_err vs torch f32 {row_err:.2e}", flush=True)
        record(work, "aec", bench(ours), 3 * fl, pas="fwd+bwd")
        # Each kernel of the backward alone (the inputs of a whole run are in place).
        split = {"states": bench(lambda: bwd.launch_one(-1))}
        for i, (kmeta, _) in enumerate(bwd.fns):
            split[kmeta["name"].rsplit("_", 1)[1]] = bench(lambda i=i: bwd.launch_one(i))
        print(f"bench {work:44s} backward kernels (ms): " + " ".join(f"{n}={t:.3f}" for n, t in split.items()),
              flush=True)
        rows_extra.append(dict(workload=work, grad_rel_err_vs_torch_f32=errs, kernel_ms=split))
    except Exception as ex:
        record(work, "aec", None, 3 * fl, pas="fwd+bwd", error=f"{type(ex).__name__}: {ex}")


index_cache = {}
rows_extra = []


def main():
    args = sys.argv[1:]
    cases_dir = args[0]
    only = set(args[args.index("--only") + 1].split(",")) if "--only" in args else None
    index = json.load(open(os.path.join(cases_dir, "index.json")))
    index_cache["bench"] = index.get("recurrent_bench", [])
    torch.zeros(1, device=dev)
    ok, checks = run_cases(cases_dir, index, only)
    rows = []
    if "--no-bench" not in args:
        workloads = json.load(open(os.path.join(cases_dir, "workloads.json")))
        rows = run_bench(cases_dir, index, workloads, fwd_only="--fwd-only" in args,
                         default_only="--default-only" in args)
    result = dict(device=torch.cuda.get_device_name(), date=datetime.date.today().isoformat(),
                  commit=os.environ.get("AEC_COMMIT", "unknown"),
                  command="python bench/recurrent_check.py " + " ".join(args),
                  torch=torch.__version__, checks=checks, rows=rows, gradient_checks=rows_extra)
    with open(os.path.join(OUT, "recurrent.json"), "w") as fh:
        json.dump(result, fh, indent=1)
    print("all recurrent checks passed" if ok else "SOME RECURRENT CHECKS FAILED", flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
