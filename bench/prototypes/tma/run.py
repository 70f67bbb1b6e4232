"""The TMA-loading forward prototype (patch.py) against the shipped kernels,
a second build and cuDNN: interleaved rounds in one process (a measurement
tool; see README.md here)."""
import ctypes, json, math, os, sys
import torch
import torch.nn.functional as F
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import gpu_check as g
from torch.nn.attention import sdpa_kernel, SDPBackend

cases = os.environ["CASES"]
new_cases = os.environ.get("NEW_CASES", cases)
tma_dir = os.environ.get("TMA_DIR", "../tma/")
index = json.load(open(f"{cases}/index.json"))
wl = {w["id"]: w for w in json.load(open(f"{cases}/workloads.json"))["workloads"]}
lib = g.libcuda
enc = lib.cuTensorMapEncodeTiled
enc.restype = ctypes.c_int

class Tmap(ctypes.Structure):
    _fields_ = [("w", ctypes.c_uint64 * 16)]

_keep = []
def aligned_tmap():
    """A CUtensorMap at a 64-byte-aligned host address (the encoder requires it)."""
    buf = ctypes.create_string_buffer(192)
    _keep.append(buf)
    return Tmap.from_address((ctypes.addressof(buf) + 63) & ~63)

def tmap(t, rows_box):
    """[N][rows][cols] bf16, boxes of 64 columns x rows_box rows, 128-byte swizzle."""
    n, rows, cols = t.shape[0] * t.shape[1], t.shape[2], t.shape[3]
    m = aligned_tmap()
    dims = (ctypes.c_uint64 * 3)(cols, rows, n)
    strides = (ctypes.c_uint64 * 2)(cols * 2, rows * cols * 2)
    box = (ctypes.c_uint32 * 3)(64, rows_box, 1)
    es = (ctypes.c_uint32 * 3)(1, 1, 1)
    r = enc(ctypes.byref(m), 9, 3, ctypes.c_void_p(t.data_ptr()), dims, strides, box, es, 0, 3, 2, 0)
    assert r == 0, f"cuTensorMapEncodeTiled {r}"
    return m

only = sys.argv[1].split(",") if len(sys.argv) > 1 else None
rounds = int(os.environ.get("ROUNDS", "3"))
out = []
for e in index["fwd_sweep"]:
    if only and e["config"] + "@" + e["workload"] not in only and e["workload"] not in only:
        continue
    w = wl[e["workload"]]
    b, h, hkv, sq, skv, dqk, dv = w["b"], w["h"], w["hkv"], w["sq"], w["skv"], w["dqk"], w["dv"]
    torch.manual_seed(0)
    q = torch.randn(b, h, sq, dqk, device=g.dev, dtype=torch.bfloat16)
    k = torch.randn(b, hkv, skv, dqk, device=g.dev, dtype=torch.bfloat16)
    v = torch.randn(b, hkv, skv, dv, device=g.dev, dtype=torch.bfloat16)
    sc = 1 / math.sqrt(dqk)
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=w["causal"], scale=sc, enable_gqa=hkv != h)
    meta = e["kernel"]
    old = g.Kernel(cases, meta)
    nm = [x for x in json.load(open(f"{new_cases}/index.json"))["fwd_sweep"] if x["workload"] == e["workload"] and x["config"] == e["config"]]
    if not nm:
        continue
    nmeta = nm[0]["kernel"]
    desc = g.Kernel(new_cases, nmeta)
    tmeta = dict(nmeta)
    tmeta["cubin"] = tma_dir + os.path.basename(meta["cubin"])
    tmeta["args"] = meta["args"] + [{"kind": "paged", "name": n} for n in ("tm_q", "tm_k", "tm_v")]
    new = g.Kernel(new_cases, tmeta)
    bn = meta["block_n"]
    extra = dict(tm_q=tmap(q, 128), tm_k=tmap(k, bn), tm_v=tmap(v, bn))
    sizes = dict(B=b, H=h, Hkv=hkv, Sq=sq, Skv=skv)
    errs = {}
    for name, kern, ex in (("shipped", old, None), ("desc", desc, None), ("tma", new, extra)):
        o, _ = kern(q, k, v, {}, sizes, ex)
        torch.cuda.synchronize()
        errs[name] = g.rel_err(o.float(), ref.float())
    fns = {"cudnn": None, "shipped": lambda: old(q, k, v, {}, sizes), "desc": lambda: desc(q, k, v, {}, sizes),
           "tma": lambda: new(q, k, v, {}, sizes, extra)}
    def cud():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=w["causal"], scale=sc, enable_gqa=hkv != h)
    fns["cudnn"] = cud
    ms = {n: [] for n in fns}
    for r in range(rounds):
        order = list(fns) if r % 2 == 0 else list(fns)[::-1]
        for n in order:
            ms[n].append(g.bench(fns[n]))
    row = dict(workload=e["workload"], config=e["config"], ms=ms, err=errs)
    out.append(row)
    med = {n: sorted(x)[len(x) // 2] for n, x in ms.items()}
    print(f"{e['workload'][:34]:34s} {e['config']:28s} cudnn {med['cudnn']:.4f} shipped {med['shipped']:.4f} desc {med['desc']:.4f} tma {med['tma']:.4f} "
          f"desc gain {med['shipped'] / med['desc']:.3f} tma gain {med['shipped'] / med['tma']:.3f} tma/cudnn {med['cudnn'] / med['tma']:.3f} err {errs['shipped']:.1e} {errs['desc']:.1e} {errs['tma']:.1e}", flush=True)
json.dump(dict(device=torch.cuda.get_device_name(), rows=out), open(os.path.join(os.environ.get("OUT", "."), "tma_rounds.json"), "w"), indent=1)
