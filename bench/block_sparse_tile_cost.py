"""The block-sparse kernel's cost per row block (tile) against the blocks it
lists: masks where every row block lists exactly k random full blocks
(B 2 x H 16, s8192, d128, 128 x 128 blocks), so the schedule has nothing to
balance, timed per k and fitted as `per tile = fixed + per block x k`.

    python bench/block_sparse_tile_cost.py <cases_dir>     # KS=1,2,4 to pick k

<cases_dir> is what `aec-bench <dir> --nvrtc --varlen-only` wrote; the
softmax entry's default kernel and its other tiles are timed (triton's
do_bench, median), per tile = time x SMs / tiles.
"""
import json, os, sys, ctypes
import torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_check import Kernel, bench, dev  # noqa
cases = sys.argv[1]
torch.zeros(1, device=dev)
sms = torch.cuda.get_device_properties(0).multi_processor_count
index = json.load(open(os.path.join(cases, "index.json")))
e = {x["example"]: x for x in index["sparse"]}["softmax"]
kerns = [("default", Kernel(cases, e["sparse"]))] + [(t["tag"], Kernel(cases, t["kernel"])) for t in e.get("tiles", [])]
b, h, s, d = 2, 16, 8192, 128
nb = s // 128
q = torch.randn(b, h, s, d, device=dev, dtype=torch.bfloat16)
k = torch.randn_like(q); v = torch.randn_like(q)
sizes = dict(B=b, H=h, Hkv=h, Sq=s, Skv=s)
res = []
for kk in [int(x) for x in os.environ.get("KS", "1,2,4,7,14,28").split(",")]:
    g = torch.Generator(device=dev).manual_seed(kk)
    idx = torch.argsort(torch.rand(1, h, nb, nb, device=dev, generator=g), dim=-1).to(torch.int32).contiguous()
    full_n = torch.full((1, h, nb), kk, device=dev, dtype=torch.int32)
    part_n = torch.zeros_like(full_n)
    order = torch.arange(b * h * nb, device=dev, dtype=torch.int32)
    extra = dict(kv_num_blocks=ctypes.c_uint64(part_n.data_ptr()), kv_indices=ctypes.c_uint64(idx.data_ptr()),
                 full_kv_num_blocks=ctypes.c_uint64(full_n.data_ptr()), full_kv_indices=ctypes.c_uint64(idx.data_ptr()),
                 mask_batches=ctypes.c_int32(1), mask_heads=ctypes.c_int32(h), mask_rows=ctypes.c_int32(nb),
                 mask_cols=ctypes.c_int32(nb), mask_block_m=ctypes.c_int32(128), mask_block_n=ctypes.c_int32(128),
                 tile_order=ctypes.c_uint64(order.data_ptr()))
    for tag, sk in kerns:
        t = bench(lambda: sk(q, k, v, {}, sizes, extra))
        tiles = b * h * nb
        per_tile = t * 1e3 * sms / tiles
        res.append((tag, kk, t, per_tile))
        print(f"{tag:8s} k={kk:3d} {t*1e3:8.1f} us  per tile {per_tile:6.2f} us  per block {per_tile/kk:5.2f} us  "
              f"{4*tiles*kk*128*128*d/(t*1e-3)/1e12:6.1f} TF/s", flush=True)
for tag, _ in kerns:
    r = [(x[1], x[2], x[3]) for x in res if x[0] == tag]
    if len(r) > 2:
        n = len(r); sx = sum(x[0] for x in r); sy = sum(x[2] for x in r)
        sxx = sum(x[0] ** 2 for x in r); sxy = sum(x[0] * x[2] for x in r)
        c = (n * sxy - sx * sy) / (n * sxx - sx * sx); a = (sy - c * sx) / n
        print(f"{tag}: per tile = {a:.2f} us + {c:.2f} us x blocks")
