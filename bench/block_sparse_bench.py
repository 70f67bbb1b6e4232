"""A block-sparse mask at s8192 against the dense kernel and FlexAttention
with the same BlockMask, in one process.

    python bench/block_sparse_bench.py <cases_dir>

<cases_dir> is what `aec-bench <cases_dir> --nvrtc --varlen-only` wrote (its
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
aec-sparse's output is compared with Flex's, before and after the timed
launches (they share one ticket counter, which each launch must leave at zero).
AEC_SPARSE_ONLY=<id>[,<id>...]: only those workloads.
AEC_SPARSE_COMPARE=<dir>[:<dir>...]: also time the `sparse` kernels of those
cases directories (earlier builds) in the same process.
Results go to $OUT/block_sparse.json.
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


def tile_order(kernel, bm, sizes):
    """compiler/src/tile_order.rs for a kernel with a tile schedule: the row
    blocks of windows of ceil(CTAs / row blocks) heads, each window sorted by
    descending listed blocks (ties in row-block order)."""
    b, h, s = sizes["B"], sizes["H"], sizes["Sq"]
    block_m = kernel.meta["block_m"]
    n_rb = (s + block_m - 1) // block_m
    listed = (bm.kv_num_blocks + bm.full_kv_num_blocks).to(torch.int64)
    rows = torch.arange(n_rb, device=dev) * block_m // BLOCK
    listed = listed[:, :, rows].expand(b, h, n_rb).reshape(-1)
    ctas = kernel.launch_grid(sizes, 1)[0]
    window = -(-ctas // n_rb) * n_rb
    tiles = torch.arange(listed.numel(), device=dev, dtype=torch.int64)
    n, most = listed.numel(), int(listed.max())
    key = (tiles // window) * (most + 1) * n + (most - listed) * n + tiles
    return tiles[torch.argsort(key)].to(torch.int32).contiguous()


def main():
    cases_dir = sys.argv[1]
    torch.zeros(1, device=dev)
    index = json.load(open(os.path.join(cases_dir, "index.json")))
    from torch.nn.attention import sdpa_kernel, SDPBackend
    from torch.nn.attention.flex_attention import flex_attention, create_block_mask
    flex = torch.compile(flex_attention)
    entries = {e["example"]: e for e in index["sparse"]}
    rows = []
    only = [w for w in os.environ.get("AEC_SPARSE_ONLY", "").split(",") if w]
    for wid, example, b, h, s, kept in WORKLOADS:
        if only and wid not in only:
            continue
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

        orders = []  # kept alive while the launches read them

        def args_of(kern):
            """`extra`, with the tile order for a kernel with a tile schedule."""
            if not kern.meta.get("tile_schedule"):
                return extra
            orders.append(tile_order(kern, bm, sizes))
            return dict(extra, tile_order=ctypes.c_uint64(orders[-1].data_ptr()))

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
        def checked_time(kern):
            """A launch checked against Flex's output, then the median time."""
            ex = args_of(kern)
            out, _ = kern(q, k, v, {}, sizes, ex)
            torch.cuda.synchronize()
            return rel_err(out.float(), of.float()), bench(lambda: kern(q, k, v, {}, sizes, ex)), ex

        err, t_sparse, ex = checked_time(sparse_k)
        # After the timed launches: each left the ticket counter at zero.
        again, _ = sparse_k(q, k, v, {}, sizes, ex)
        torch.cuda.synchronize()
        err_again = rel_err(again.float(), of.float())
        record("aec-sparse", t_sparse, fl, err_vs_flex=err, err_after_timing=err_again, vs_dense=t_dense / t_sparse,
               vs_flex=t_flex / t_sparse, tile_schedule=bool(sparse_k.meta.get("tile_schedule")))
        if sparse_rb is not None:
            err2, t2, _ = checked_time(sparse_rb)
            record("aec-sparse-per-block", t2, fl, err_vs_flex=err2, vs_dense=t_dense / t2, vs_flex=t_flex / t2)
        for tile in e.get("tiles", []):
            # Other tiles of the block-sparse kernel, same process.
            err4, t4, _ = checked_time(Kernel(cases_dir, tile["kernel"]))
            record("aec-sparse-" + tile["tag"], t4, fl, err_vs_flex=err4, vs_flex=t_flex / t4, vs_default=t_sparse / t4)
        for other_dir in os.environ.get("AEC_SPARSE_COMPARE", "").split(":"):
            # Ablation: the same kernel from another cases directory (an
            # earlier build), same process.
            if not other_dir:
                continue
            oe = {x["example"]: x for x in json.load(open(os.path.join(other_dir, "index.json")))["sparse"]}[example]
            err3, t3, _ = checked_time(Kernel(other_dir, oe["sparse"]))
            record("compare:" + os.path.basename(other_dir.rstrip("/")), t3, fl, err_vs_flex=err3,
                   vs_flex=t_flex / t3, vs_new=t_sparse / t3)
        del q, k, v, od, of, again
        torch.cuda.empty_cache()
    res = dict(device=torch.cuda.get_device_name(), date=str(datetime.date.today()),
               command="python bench/block_sparse_bench.py bench/varlen-cases", torch=torch.__version__, rows=rows)
    json.dump(res, open(os.path.join(OUT, "block_sparse.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
