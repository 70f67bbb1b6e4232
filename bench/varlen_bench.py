"""Variable-length (packed) prefill: aec's varlen forward against the anchors, in one process.

    python bench/varlen_bench.py <cases_dir>

<cases_dir> is what `aec-bench <cases_dir> --nvrtc --varlen-only` wrote (the
varlen kernels of softmax and causal softmax at d128 and the dense kernels of
the same variants). Per workload, a seeded batch of sequences of different
lengths, timed (triton's do_bench, median) as:
- aec-varlen: the packed batch `[1, H, Tq, D]` with `cu_seqlens` (the
  default tiles, a block per row block); aec-varlen-persistent: the same tiles
  walked by one block per multiprocessor (the dense default), to compare;
- fa2-varlen: PyTorch's FlashAttention-2 varlen kernel on the packed batch
  (`[Tq, H, D]`, the same cu_seqlens);
- flex-document: FlexAttention on the packed batch as one sequence with the
  document mask (a BlockMask built from the sequence ids);
- cudnn-padded and aec-padded: every sequence padded to the longest, then the
  dense kernel (what a caller without varlen runs).
TFLOP/s count the useful work only (each sequence's own pairs). Results go to
$OUT/varlen.json.
"""
import datetime, json, math, os, random, sys
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_check import (OUT, BackwardKernel, bench, check, ctypes, dev, get_function, libcuda,  # noqa: E402
                       load_module, rel_err)

H, D = 16, 128
WORKLOADS = [
    # id, sequences, shortest, longest
    ("varlen-16seq-256to4096", 16, 256, 4096),
    ("varlen-64seq-64to1024", 64, 64, 1024),
]


class VarlenKernel:
    """A generated forward (varlen or dense) launched through the driver."""

    def __init__(self, cases_dir, meta):
        self.meta = meta
        self.module = load_module(cases_dir, meta["cubin"])
        self.fn = get_function(self.module, meta["name"], meta["smem_bytes"])
        self.sms = torch.cuda.get_device_properties(dev).multi_processor_count

    def grid(self, b, h, sq):
        bm, split = self.meta["block_m"], self.meta.get("dv_split", 1)
        x = (sq + bm - 1) // bm * split
        if not self.meta.get("persistent"):
            return x, h, b
        units = ((x // split) + 1) // 2 * split * h * b
        return min(units, self.sms), 1, 1

    def __call__(self, q, k, v, o, rowout, sizes, cu_q=None, cu_k=None):
        vals = []
        for a in self.meta["args"]:
            kind = a["kind"]
            if kind == "tensor":
                vals.append(ctypes.c_uint64({"q": q, "k": k, "v": v, "o": o}[a["name"]].data_ptr()))
            elif kind == "rowout":
                vals.append(ctypes.c_uint64(rowout.data_ptr()))
            elif kind == "cu_seqlens":
                vals.append(ctypes.c_uint64(cu_q.data_ptr()))
            elif kind == "cu_seqlens_k":
                vals.append(ctypes.c_uint64(cu_k.data_ptr()))
            elif kind == "size":
                vals.append(ctypes.c_int32(sizes[a["axis"]]))
            else:
                raise RuntimeError(f"unexpected argument {a}")
        params = (ctypes.c_void_p * len(vals))(*[ctypes.cast(ctypes.byref(x), ctypes.c_void_p) for x in vals])
        x, y, z = self.grid(sizes["B"], sizes["H"], sizes["Sq"])
        stream = torch.cuda.current_stream().cuda_stream
        check(libcuda.cuLaunchKernel(self.fn, x, y, z, self.meta["threads"], 1, 1, self.meta["smem_bytes"],
                                     ctypes.c_void_p(stream), params, None), "cuLaunchKernel")
        return o


def fa2_varlen(q, k, v, cu, longest, causal, scale):
    """PyTorch's FlashAttention-2 varlen forward: the public `varlen_attn`
    where its signature takes the mask, else the aten op it wraps."""
    import inspect
    try:
        from torch.nn.attention.varlen import varlen_attn
        params = inspect.signature(varlen_attn).parameters
    except ImportError:
        params = {}
    if "is_causal" in params:
        return varlen_attn(q, k, v, cu, cu, longest, longest, is_causal=causal), "varlen_attn(is_causal)"
    if "window_size" in params:
        win = (-1, 0) if causal else (-1, -1)
        return varlen_attn(q, k, v, cu, cu, longest, longest, window_size=win), "varlen_attn(window_size)"
    out = torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, longest, longest, 0.0, causal, False,
                                                  scale=scale)
    return out[0], "aten._flash_attention_forward"


def document_block_mask(lens, causal):
    """Flex's BlockMask of the packed batch: a key is seen by the queries of
    its own sequence (and not after them, with `causal`)."""
    from torch.nn.attention.flex_attention import create_block_mask
    doc = torch.repeat_interleave(torch.arange(len(lens), device=dev), torch.tensor(lens, device=dev))
    total = sum(lens)
    if causal:
        def mask_fn(b, h, i, j):
            return (doc[i] == doc[j]) & (i >= j)
    else:
        def mask_fn(b, h, i, j):
            return doc[i] == doc[j]
    return create_block_mask(mask_fn, None, None, total, total, device=dev)


def bench_fwd_bwd(work, entry, cases_dir, packed_k, q_thd, k_thd, v_thd, q_p, k_p, v_p, cu, longest, sizes, causal,
                  scale, fl, record, flex, lens, total):
    torch.manual_seed(1)
    do_thd = torch.randn_like(q_thd)
    do_p = do_thd.transpose(0, 1).contiguous()
    ref = None
    leaves = [t.detach().clone().requires_grad_() for t in (q_thd, k_thd, v_thd)]

    def fa2_fb():
        out, _ = fa2_varlen(*leaves, cu, longest, causal, scale)
        out.backward(do_thd)
    try:
        fa2_fb()
        ref = [t.grad.transpose(0, 1).float() for t in leaves]
        import triton
        ms = triton.testing.do_bench(fa2_fb, warmup=10, rep=50, return_mode="median", grad_to_none=leaves)
        record(work, "fa2-varlen", ms, fl, **{"pass": "fwd+bwd"})
    except Exception as e:
        record(work, "fa2-varlen", None, fl, error=f"{type(e).__name__}: {str(e).splitlines()[0][:160]}",
               **{"pass": "fwd+bwd"})
    try:
        bm = document_block_mask(lens, causal)
        fl_leaves = [t.detach().clone().unsqueeze(0).requires_grad_() for t in (q_p, k_p, v_p)]

        def flex_fb():
            out = flex(*fl_leaves, block_mask=bm, scale=scale)
            out.backward(do_p.unsqueeze(0))
        flex_fb()
        import triton
        ms = triton.testing.do_bench(flex_fb, warmup=10, rep=50, return_mode="median", grad_to_none=fl_leaves)
        record(work, "flex-document", ms, fl, **{"pass": "fwd+bwd"})
    except Exception as e:
        record(work, "flex-document", None, fl, error=f"{type(e).__name__}: {str(e).splitlines()[0][:160]}",
               **{"pass": "fwd+bwd"})
    bk = BackwardKernel(cases_dir, entry["backward"])
    o = torch.empty_like(v_p)
    rowout = torch.empty(max(1, len(entry["varlen"]["row_outputs"])), q_p.shape[0] * total, device=dev,
                         dtype=torch.float32)

    def ours():
        packed_k(q_p, k_p, v_p, o, rowout, sizes, cu, cu)
        return bk(q_p, k_p, v_p, o, do_p, rowout, {}, sizes, cu, cu)[:3]
    grads = ours()
    torch.cuda.synchronize()
    err = max(rel_err(g.float(), r) for g, r in zip(grads, ref)) if ref is not None else None
    record(work, "aec-varlen", bench(ours), fl, err=err, kernel=entry["backward"]["launches"][1]["name"],
           **{"pass": "fwd+bwd"})


def main():
    cases_dir = sys.argv[1]
    torch.zeros(1, device=dev)  # PyTorch's context, which the cubins load into
    index = json.load(open(os.path.join(cases_dir, "index.json")))
    from torch.nn.attention import sdpa_kernel, SDPBackend
    from torch.nn.attention.flex_attention import flex_attention
    torch._dynamo.config.cache_size_limit = 64
    flex = torch.compile(flex_attention)
    rows = []
    scale = 1 / math.sqrt(D)

    def record(work, impl, ms, fl, **extra):
        row = dict(workload=work, impl=impl, **extra)
        if ms is not None:
            row.update(ms=ms, tflops=fl / (ms * 1e-3) / 1e12)
            print(f"bench {work:26s} {impl:16s} {ms:8.4f} ms {row['tflops']:7.1f} TF/s "
                  + " ".join(f"{k}={v:.2e}" if isinstance(v, float) else f"{k}={v}" for k, v in extra.items()),
                  flush=True)
        else:
            print(f"bench {work:26s} {impl:16s} ERROR {extra.get('error')}", flush=True)
        rows.append(row)

    for entry in index["varlen"]:
        causal = entry["causal"]
        packed_k = VarlenKernel(cases_dir, entry["varlen"])
        dense_k = VarlenKernel(cases_dir, entry["dense"])
        for wid, n, lo, hi in WORKLOADS:
            work = wid + ("-causal" if causal else "")
            rng = random.Random(n * 1000 + hi)
            lens = [rng.randint(lo, hi) for _ in range(n)]
            total, longest = sum(lens), max(lens)
            pairs = sum(l * (l + 1) // 2 if causal else l * l for l in lens)
            fl = 2.0 * H * pairs * (2 * D)
            cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), device=dev, dtype=torch.int32)
            torch.manual_seed(0)
            q_thd = torch.randn(total, H, D, device=dev, dtype=torch.bfloat16)
            k_thd = torch.randn(total, H, D, device=dev, dtype=torch.bfloat16)
            v_thd = torch.randn(total, H, D, device=dev, dtype=torch.bfloat16)
            q_p, k_p, v_p = (t.transpose(0, 1).contiguous() for t in (q_thd, k_thd, v_thd))  # [H, T, D]
            meta = dict(sequences=n, total=total, longest=longest, lens=lens)
            # aec varlen
            o = torch.empty(H, total, D, device=dev, dtype=torch.bfloat16)
            rowout = torch.empty(max(1, len(entry["varlen"]["row_outputs"])), H * total, device=dev,
                                 dtype=torch.float32)
            sizes = dict(B=n, H=H, Hkv=H, Sq=longest, Skv=longest)
            packed_k(q_p, k_p, v_p, o, rowout, sizes, cu, cu)
            torch.cuda.synchronize()
            ref = None
            try:
                ref_thd, how = fa2_varlen(q_thd, k_thd, v_thd, cu, longest, causal, scale)
                ref = ref_thd.transpose(0, 1).float()
                record(work, "fa2-varlen", bench(lambda: fa2_varlen(q_thd, k_thd, v_thd, cu, longest, causal, scale)),
                       fl, api=how)
            except Exception as e:
                record(work, "fa2-varlen", None, fl, error=f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")
            # FlexAttention, document mask over the packed sequence
            try:
                bm = document_block_mask(lens, causal)
                qf, kf, vf = (t.unsqueeze(0) for t in (q_p, k_p, v_p))

                def f_flex():
                    return flex(qf, kf, vf, block_mask=bm, scale=scale)
                out = f_flex()[0].float()
                if ref is None:
                    ref = out
                record(work, "flex-document", bench(f_flex), fl, err=rel_err(out, ref))
            except Exception as e:
                record(work, "flex-document", None, fl, error=f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")
            err = rel_err(o.float(), ref) if ref is not None else None
            record(work, "aec-varlen", bench(lambda: packed_k(q_p, k_p, v_p, o, rowout, sizes, cu, cu)), fl,
                   err=err, kernel=entry["varlen"]["name"], **meta)
            if "varlen_persistent" in entry:
                pb = VarlenKernel(cases_dir, entry["varlen_persistent"])
                o2 = torch.empty_like(o)
                pb(q_p, k_p, v_p, o2, rowout, sizes, cu, cu)
                torch.cuda.synchronize()
                record(work, "aec-varlen-persistent", bench(lambda: pb(q_p, k_p, v_p, o2, rowout, sizes, cu, cu)),
                       fl, err=rel_err(o2.float(), ref) if ref is not None else None,
                       kernel=entry["varlen_persistent"]["name"])
            # Forward + backward: aec's varlen forward and backward against
            # FA2's varlen and Flex's document mask through autograd.
            if "backward" in entry:
                bench_fwd_bwd(work, entry, cases_dir, packed_k, q_thd, k_thd, v_thd, q_p, k_p, v_p, cu, longest,
                              sizes, causal, scale, fl * 3.5, record, flex, lens, total)
            # Padded: every sequence to the longest.
            qb = torch.zeros(n, H, longest, D, device=dev, dtype=torch.bfloat16)
            kb, vb = torch.zeros_like(qb), torch.zeros_like(qb)
            for s, l in enumerate(lens):
                a = int(cu[s])
                qb[s, :, :l] = q_p[:, a:a + l]
                kb[s, :, :l] = k_p[:, a:a + l]
                vb[s, :, :l] = v_p[:, a:a + l]
            # Keys past a sequence's end must not count: a boolean key mask
            # for cuDNN (causal as well where asked).
            keep = torch.arange(longest, device=dev)[None, :] < torch.tensor(lens, device=dev)[:, None]
            am = keep[:, None, None, :]
            if causal:
                am = am & torch.ones(longest, longest, device=dev, dtype=torch.bool).tril()[None, None]

            def f_cudnn():
                with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
                    return F.scaled_dot_product_attention(qb, kb, vb, attn_mask=am, scale=scale)
            try:
                out = f_cudnn()
                got = torch.cat([out[s, :, :l] for s, l in enumerate(lens)], dim=1).float()
                record(work, "sdpa-padded", bench(f_cudnn), fl, err=rel_err(got, ref) if ref is not None else None)
            except Exception as e:
                record(work, "sdpa-padded", None, fl, error=f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")
            # aec's dense kernel on the padded batch (it does not know the
            # lengths: padding keys count; only the row cost is compared).
            od = torch.empty(n, H, longest, D, device=dev, dtype=torch.bfloat16)
            rd = torch.empty(max(1, len(entry["dense"]["row_outputs"])), n * H * longest, device=dev,
                             dtype=torch.float32)
            dsizes = dict(B=n, H=H, Hkv=H, Sq=longest, Skv=longest)
            record(work, "aec-dense-padded", bench(lambda: dense_k(qb, kb, vb, od, rd, dsizes)), fl,
                   note="padding keys attended: timing only")
            del qb, kb, vb, od, q_thd, k_thd, v_thd, q_p, k_p, v_p
            torch.cuda.empty_cache()
    res = dict(device=torch.cuda.get_device_name(), date=str(datetime.date.today()),
               command="python bench/varlen_bench.py bench/varlen-cases", torch=torch.__version__, rows=rows)
    json.dump(res, open(os.path.join(OUT, "varlen.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
