"""Decoding over a paged KV cache against the same kernel on a contiguous cache, in one process.

    python bench/paged_bench.py <cases_dir>

<cases_dir> is what `aec-bench <cases_dir> --nvrtc --varlen-only` wrote (its
`paged` entry: the decoding forward of examples/decode.rs, d128, over a
contiguous and over a paged cache). Per workload (every sequence the same
length, so both read the same keys), timed as CUDA-graph replays (gpu_check's
`bench_graph`: decoding calls are as short as the host's work to launch them;
every cache here spans at least 134 MB, well past the L2):
- aec-contiguous: the dense decoding kernel on `[B, Hkv, Skv, D]`;
- aec-paged-<P>: the paged kernel on pages of P rows placed in shuffled order;
- cudnn: SDPA (cuDNN backend) on the contiguous cache, the anchor.
Bytes moved (the K/V cache and q, o) against the device-to-device copy
bandwidth measured in the same run. Results go to $OUT/paged.json.
PAGED_PAGES=64: only these page sizes (16, 64 and 256 by default).
SPLIT_SWEEP=1,2,4: the contiguous kernel, and the paged one at 64-row pages,
also at those KV split counts.
PAGED_SHAPES=32x4096,16x8192: these batch × length shapes (32 heads, 8 KV
heads) instead of the workloads below.
AEC_PAGED_COMPARE=<dir>[:<dir>...]: also time the `paged` entries of those
cases directories (earlier builds, `aec-bench <dir> --nvrtc --varlen-only`)
in the same process after this build's, their rows tagged `@<dir name>`
(a comparison across processes or machines mixes in their differences).
"""
import datetime, json, math, os, sys
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_check import OUT, Kernel, bench_graph, copy_bandwidth, ctypes, dev, rel_err  # noqa: E402


def bench(fn):
    """Milliseconds per call of `fn`, graph-timed."""
    return bench_graph(lambda i: fn(), 1)

WORKLOADS = [
    # id, B, H, Hkv, Skv
    ("decode-b32-h32-kv8-s4096", 32, 32, 8, 4096),
    ("decode-b8-h32-kv8-s16384", 8, 32, 8, 16384),
    # The decoding workloads of shared/reference/workloads.json at d128.
    ("decode-gqa-b64-h32-kv8-kv4096-d128", 64, 32, 8, 4096),
    ("decode-gqa-b1-h32-kv8-kv32768-d128", 1, 32, 8, 32768),
]
if os.environ.get("PAGED_SHAPES"):
    WORKLOADS = [(f"decode-b{b}-h32-kv8-s{s}", int(b), 32, 8, int(s))
                 for b, s in (x.split("x") for x in os.environ["PAGED_SHAPES"].split(","))]
PAGES = [int(x) for x in os.environ.get("PAGED_PAGES", "16,64,256").split(",")]
SPLIT_SWEEP = [int(x) for x in os.environ.get("SPLIT_SWEEP", "").split(",") if x]


def main():
    cases_dir = sys.argv[1]
    torch.zeros(1, device=dev)  # PyTorch's context, which the cubins load into
    index = json.load(open(os.path.join(cases_dir, "index.json")))
    from torch.nn.attention import sdpa_kernel, SDPBackend
    copy_gbps = copy_bandwidth()
    rows = [dict(workload="copy", impl="torch copy_ (1 GiB)", gbps=copy_gbps)]
    print(f"device-to-device copy: {copy_gbps:.0f} GB/s", flush=True)
    # (cases dir, entry, row tag): this build's entries, then those of the
    # builds to compare with.
    builds = [(cases_dir, e, "") for e in index["paged"]]
    for other in os.environ.get("AEC_PAGED_COMPARE", "").split(":"):
        if other:
            name = os.path.basename(other.rstrip("/"))
            builds += [(other, e, f"@{name}") for e in json.load(open(os.path.join(other, "index.json")))["paged"]]
    for build_dir, entry, build_tag in builds:
        d = entry["dqk"]
        tiles = entry.get("tiles", "default")
        tag = ("" if tiles == "default" else f"[{tiles}]") + build_tag
        print(f"tiles {tiles}{build_tag}: {entry['dense']['name']} {entry['dense'].get('ptxas', '')}", flush=True)
        dense_k, paged_k = Kernel(build_dir, entry["dense"]), Kernel(build_dir, entry["paged"])
        for wid, b, h, hkv, skv in WORKLOADS:
            torch.manual_seed(0)
            q = torch.randn(b, h, 1, d, device=dev, dtype=torch.bfloat16)
            k = torch.randn(b, hkv, skv, d, device=dev, dtype=torch.bfloat16)
            v = torch.randn(b, hkv, skv, d, device=dev, dtype=torch.bfloat16)
            nbytes = 2 * (2 * b * hkv * skv * d + 2 * b * h * d)
            sizes = dict(B=b, H=h, Hkv=hkv, Sq=1, Skv=skv)

            def record(impl, ms, **extra):
                if impl != "cudnn":
                    impl += tag
                row = dict(workload=wid, impl=impl, ms=ms, gbps=nbytes / (ms * 1e-3) / 1e9, **extra)
                row["copy_fraction"] = row["gbps"] / copy_gbps
                rows.append(row)
                print(f"bench {wid:28s} {impl:16s} {ms * 1e3:8.1f} us {row['gbps']:6.0f} GB/s "
                      f"= {row['copy_fraction']:.2f} of copy "
                      + " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in extra.items()),
                      flush=True)
                return row

            def f_cudnn():
                with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                    return F.scaled_dot_product_attention(q, k, v, scale=1 / math.sqrt(d), enable_gqa=True)
            try:
                ref = f_cudnn().float()
                record("cudnn", bench(f_cudnn))
            except Exception as e:
                ref = None
                rows.append(dict(workload=wid, impl="cudnn", error=f"{type(e).__name__}: {e}"))
            o, _ = dense_k(q, k, v, {}, sizes)
            torch.cuda.synchronize()
            base = record("aec-contiguous", bench(lambda: dense_k(q, k, v, {}, sizes)),
                          err=rel_err(o.float(), ref) if ref is not None else float("nan"),
                          splits=dense_k.last_splits)
            # The launch rule's split count against others (what a better
            # rule would choose; the split rule is shared with the paged kernel).
            for forced in SPLIT_SWEEP:
                dense_k.splits_override = forced
                ms = bench(lambda: dense_k(q, k, v, {}, sizes))
                record(f"aec-contiguous-{forced}kv", ms, slower_than_contiguous=ms / base["ms"] - 1, splits=forced)
            dense_k.splits_override = None
            for p in PAGES:
                per = skv // p
                pages = b * per
                order = torch.randperm(pages, device=dev, generator=torch.Generator(device=dev).manual_seed(p))
                table = order.view(b, per).to(torch.int32).contiguous()
                # [pages, Hkv, P, D]: page table[s][i] holds rows i·P … of sequence s.
                kc = torch.empty(pages, hkv, p, d, device=dev, dtype=torch.bfloat16)
                vc = torch.empty_like(kc)
                kc[table.view(-1).long()] = k.view(b, hkv, per, p, d).transpose(1, 2).reshape(pages, hkv, p, d)
                vc[table.view(-1).long()] = v.view(b, hkv, per, p, d).transpose(1, 2).reshape(pages, hkv, p, d)
                lens = torch.full((b,), skv, device=dev, dtype=torch.int32)
                extra = dict(block_table=ctypes.c_uint64(table.data_ptr()), seqlens_k=ctypes.c_uint64(lens.data_ptr()),
                             pages_per_seq=ctypes.c_int32(per), page_shift=ctypes.c_int32(p.bit_length() - 1))
                op, _ = paged_k(q, kc, vc, {}, sizes, extra)
                torch.cuda.synchronize()
                ms = bench(lambda: paged_k(q, kc, vc, {}, sizes, extra))
                record(f"aec-paged-{p}", ms, err=rel_err(op.float(), o.float()),
                       slower_than_contiguous=ms / base["ms"] - 1, splits=paged_k.last_splits)
                if p == 64:
                    # The paged kernel at the swept split counts too (its
                    # page lookups make it the more sensitive to blocks in
                    # flight: bench/NOTES.md session 66).
                    for forced in SPLIT_SWEEP:
                        paged_k.splits_override = forced
                        ms = bench(lambda: paged_k(q, kc, vc, {}, sizes, extra))
                        record(f"aec-paged-{p}-{forced}kv", ms, slower_than_contiguous=ms / base["ms"] - 1,
                               splits=forced)
                    paged_k.splits_override = None
                del kc, vc
            del q, k, v
            torch.cuda.empty_cache()
    res = dict(device=torch.cuda.get_device_name(), date=str(datetime.date.today()),
               command="python bench/paged_bench.py bench/varlen-cases", torch=torch.__version__, rows=rows)
    json.dump(res, open(os.path.join(OUT, "paged.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
