"""A block-sparse mask at s8192 against the dense kernel and FlexAttention
with the same BlockMask, in one process.

    python bench/block_sparse_bench.py <cases_dir>

<cases_dir> is what `aec-bench <cases_dir> --nvcc … --varlen-only` wrote (its
`sparse` entries: softmax and causal softmax, d128, the sm_90a default
tiles, dense and block-sparse). Per workload, timed with triton's do_bench
(median):
- aec-dense: the variant's dense kernel on the whole sequence;
- aec-sparse (persistent) and aec-sparse-per-block: the block-sparse kernel with FlexAttention's BlockMask
  tensors (`kv_num_blocks`, `kv_indices`, `full_kv_num_blocks`,
  `full_kv_indices`, 128 x 128 blocks) passed as they are;
- flex: `torch.compile(flex_attention)` with the same BlockMask;
- cudnn: dense SDPA (cuDNN backend), for scale.
TFLOP/s count the pairs the mask shows (visible blocks x 128 x 128 x 4 x D).
aec-sparse's output is compared with Flex's. Results go to $OUT/block_sparse.json.
"""
import datetime, json, math, os, sys
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_check import OUT, Kernel, bench, ctypes, dev, rel_err  # noqa: E402

BLOCK = 128
WORKLOADS = [
    # id, example, B, H, S, kept fraction of blocks (None: the variant's own mask)
    ("sparse90-b2-h16-s8192", "softmax", 2, 16, 8192, 0.10),
    ("sparse90-b1-h32-s8192", "softmax", 1, 32, 8192, 0.10),
    ("sparse75-b2-h16-s8192", "softmax", 2, 16, 8192, 0.25),
    ("causal-b2-h16-s8192", "softmax_causal", 2, 16, 8192, None),
]


def main():
    cases_dir = sys.argv[1]
    torch.zeros(1, device=dev)
    index = json.load(open(os.path.join(cases_dir, "index.json")))
    from torch.nn.attention import sdpa_kernel, SDPBackend
    from torch.nn.attention.flex_attention import flex_attention, create_block_mask
    flex = torch.compile(flex_attention)
    entries = {e["example"]: e for e in index["sparse"]}
    rows = []
    for wid, example, b, h, s, kept in WORKLOADS:
        e = entries[example]
        d = e["dqk"]
        dense_k, sparse_k = Kernel(cases_dir, e["dense"]), Kernel(cases_dir, e["sparse"])
        sparse_rb = Kernel(cases_dir, e["sparse_per_block"]) if "sparse_per_block" in e else None
        torch.manual_seed(0)
        q = torch.randn(b, h, s, d, device=dev, dtype=torch.bfloat16)
        k = torch.randn(b, h, s, d, device=dev, dtype=torch.bfloat16)
        v = torch.randn(b, h, s, d, device=dev, dtype=torch.bfloat16)
        scale = 1 / math.sqrt(d)
        nb = s // BLOCK
        if kept is None:
            def mask_mod(bb, hh, qi, ki):
                return qi >= ki
        else:
            # Each head keeps its own random blocks, the diagonal always (no
            # row without keys).
            g = torch.Generator(device=dev).manual_seed(1)
            keep = torch.rand(h, nb, nb, device=dev, generator=g) < kept
            keep |= torch.eye(nb, device=dev, dtype=torch.bool)

            def mask_mod(bb, hh, qi, ki):
                return keep[hh, qi // BLOCK, ki // BLOCK]
        bm = create_block_mask(mask_mod, None, h, s, s, device=dev, BLOCK_SIZE=BLOCK)
        visible_blocks = int(bm.kv_num_blocks.sum() + bm.full_kv_num_blocks.sum())
        density = visible_blocks / (h * nb * nb)
        pairs = b * (visible_blocks * BLOCK * BLOCK if kept is not None else h * s * (s + 1) / 2)
        fl = 4.0 * pairs * d
        sizes = dict(B=b, H=h, Hkv=h, Sq=s, Skv=s)
        ints = [t.to(torch.int32).contiguous() for t in
                (bm.kv_num_blocks, bm.kv_indices, bm.full_kv_num_blocks, bm.full_kv_indices)]
        extra = dict(kv_num_blocks=ctypes.c_uint64(ints[0].data_ptr()), kv_indices=ctypes.c_uint64(ints[1].data_ptr()),
                     full_kv_num_blocks=ctypes.c_uint64(ints[2].data_ptr()),
                     full_kv_indices=ctypes.c_uint64(ints[3].data_ptr()),
                     mask_batches=ctypes.c_int32(ints[0].shape[0]), mask_heads=ctypes.c_int32(ints[0].shape[1]),
                     mask_rows=ctypes.c_int32(ints[0].shape[2]), mask_cols=ctypes.c_int32(ints[1].shape[3]),
                     mask_block_m=ctypes.c_int32(BLOCK), mask_block_n=ctypes.c_int32(BLOCK))

        def record(impl, ms, flops, **extra_fields):
            row = dict(workload=wid, impl=impl, ms=ms, density=density, **extra_fields)
            if ms:
                row["tflops"] = flops / (ms * 1e-3) / 1e12
            rows.append(row)
            print(f"bench {wid:24s} {impl:12s} " + (f"{ms * 1e3:9.1f} us {row['tflops']:6.1f} TF/s " if ms else "")
                  + " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in extra_fields.items()),
                  flush=True)
            return row

        dense_fl = 4.0 * b * h * s * s * d / (2 if kept is None else 1)
        od, _ = dense_k(q, k, v, {}, sizes)
        t_dense = bench(lambda: dense_k(q, k, v, {}, sizes))
        record("aec-dense", t_dense, dense_fl)
        try:
            def f_cudnn():
                with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                    return F.scaled_dot_product_attention(q, k, v, scale=scale, is_causal=kept is None)
            record("cudnn-dense", bench(f_cudnn), dense_fl)
        except Exception as ex:
            rows.append(dict(workload=wid, impl="cudnn-dense", error=f"{type(ex).__name__}: {ex}"))
        of = flex(q, k, v, block_mask=bm, scale=scale)
        t_flex = bench(lambda: flex(q, k, v, block_mask=bm, scale=scale))
        record("flex", t_flex, fl)
        os_, _ = sparse_k(q, k, v, {}, sizes, extra)
        torch.cuda.synchronize()
        err = rel_err(os_.float(), of.float())
        t_sparse = bench(lambda: sparse_k(q, k, v, {}, sizes, extra))
        record("aec-sparse", t_sparse, fl, err_vs_flex=err, vs_dense=t_dense / t_sparse, vs_flex=t_flex / t_sparse)
        if sparse_rb is not None:
            o2, _ = sparse_rb(q, k, v, {}, sizes, extra)
            torch.cuda.synchronize()
            err2 = rel_err(o2.float(), of.float())
            t2 = bench(lambda: sparse_rb(q, k, v, {}, sizes, extra))
            record("aec-sparse-per-block", t2, fl, err_vs_flex=err2, vs_dense=t_dense / t2, vs_flex=t_flex / t2)
        del q, k, v, od, of, os_
        torch.cuda.empty_cache()
    res = dict(device=torch.cuda.get_device_name(), date=str(datetime.date.today()),
               command="python bench/block_sparse_bench.py bench/varlen-cases", torch=torch.__version__, rows=rows)
    json.dump(res, open(os.path.join(OUT, "block_sparse.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
