"""GPU check and benchmark of aec's generated kernels, on a GPU machine.

    python bench/gpu_check.py <cases_dir> [--only id,id] [--no-bench] [--repeat N]

<cases_dir> is what `aec-bench <cases_dir> --nvcc …` wrote: per correctness
case the kernel (cubin), bf16 inputs and the f64 reference interpreter's
outputs; per benchmark workload a kernel. Our kernels are loaded through the
CUDA driver (ctypes) into PyTorch's context, so they run in the same process,
on the same tensors and with the same timing method (triton's do_bench,
median) as the anchors. Results go to $OUT/results.json in the format of
shared/design.md §11.
"""
import ctypes, datetime, json, math, os, sys
import torch
import torch.nn.functional as F

OUT = os.environ.get("OUT", "/tmp/aec-out")
os.makedirs(OUT, exist_ok=True)
dev = "cuda"

libcuda = ctypes.CDLL("libcuda.so.1")
libcuda.cuModuleLoadData.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p]
libcuda.cuModuleGetFunction.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_char_p]
libcuda.cuFuncSetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
libcuda.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8


def check(res, what):
    if res != 0:
        name = ctypes.c_char_p()
        libcuda.cuGetErrorName(res, ctypes.byref(name))
        raise RuntimeError(f"{what}: {name.value.decode() if name.value else res}")


class Kernel:
    """A generated forward kernel loaded from its cubin."""

    def __init__(self, cases_dir, meta):
        self.meta = meta
        data = open(os.path.join(cases_dir, meta["cubin"]), "rb").read()
        self.module = ctypes.c_void_p()
        check(libcuda.cuModuleLoadData(ctypes.byref(self.module), data), "cuModuleLoadData")
        self.fn = ctypes.c_void_p()
        check(libcuda.cuModuleGetFunction(ctypes.byref(self.fn), self.module, meta["name"].encode()),
              "cuModuleGetFunction " + meta["name"])
        check(libcuda.cuFuncSetAttribute(self.fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                         meta["smem_bytes"]), "cuFuncSetAttribute")

    def __call__(self, q, k, v, customs, sizes):
        b, h, sq, dv = sizes["B"], sizes["H"], sizes["Sq"], v.shape[-1]
        for name, t in (("q", q), ("k", k), ("v", v)):
            assert t.is_contiguous() and t.dtype == torch.bfloat16, f"tensor `{name}` must be contiguous bf16"
        o = torch.empty(b, h, sq, dv, device=dev, dtype=torch.bfloat16)
        rowout = torch.empty(max(1, len(self.meta["row_outputs"])), b * h * sq, device=dev, dtype=torch.float32)
        vals = []
        for a in self.meta["args"]:
            kind = a["kind"]
            if kind == "tensor":
                vals.append(ctypes.c_uint64({"q": q, "k": k, "v": v, "o": o}[a["name"]].data_ptr()))
            elif kind == "rowout":
                vals.append(ctypes.c_uint64(rowout.data_ptr()))
            elif kind == "custom":
                vals.append(ctypes.c_uint64(customs[a["name"]].data_ptr()))
            else:
                vals.append(ctypes.c_int32(sizes[a["axis"]]))
        params = (ctypes.c_void_p * len(vals))(*[ctypes.cast(ctypes.byref(x), ctypes.c_void_p) for x in vals])
        bm = self.meta["block_m"]
        stream = torch.cuda.current_stream().cuda_stream
        check(libcuda.cuLaunchKernel(self.fn, (sq + bm - 1) // bm, h, b, self.meta["threads"], 1, 1,
                                     self.meta["smem_bytes"], ctypes.c_void_p(stream), params, None), "cuLaunchKernel")
        return o, rowout


def load_bin(path, dtype, shape):
    data = bytearray(open(path, "rb").read())
    return torch.frombuffer(data, dtype=dtype).reshape(shape).to(dev)


def rel_err(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def run_cases(cases_dir, index, only):
    rows = []
    ok = True
    for c in index["cases"]:
        if only and c["id"] not in only:
            continue
        cid, s, km = c["id"], c["sizes"], c["kernel"]
        base = os.path.join(cases_dir, cid)
        try:
            kern = Kernel(cases_dir, km)
            q = load_bin(base + ".q.bin", torch.bfloat16, c["shapes"]["q"])
            k = load_bin(base + ".k.bin", torch.bfloat16, c["shapes"]["k"])
            v = load_bin(base + ".v.bin", torch.bfloat16, c["shapes"]["v"])
            customs = {x["name"]: load_bin(f"{base}.in_{x['name']}.bin", torch.float32, x["shape"]) for x in c["customs"]}
            o, rowout = kern(q, k, v, customs, s)
            torch.cuda.synchronize()
            o_ref = load_bin(base + ".o_ref.bin", torch.float32, list(o.shape))
            err = rel_err(o.float(), o_ref)
            nan = bool(torch.isnan(o.float()).any().item())
            # Row outputs (final row scales, final state): equal where the
            # reference is infinite (fully masked rows), close elsewhere.
            n_rows = len(km["row_outputs"])
            row_err = 0.0
            if n_rows:
                ref_rows = load_bin(base + ".rows_ref.bin", torch.float32, [n_rows, -1])
                got = rowout[:n_rows]
                fin = torch.isfinite(ref_rows)
                same_inf = bool((got[~fin] == ref_rows[~fin]).all().item())
                row_err = rel_err(got[fin], ref_rows[fin]) if fin.any() else 0.0
                if not same_inf:
                    row_err = float("inf")
            passed = err < 1e-2 and row_err < 1e-2 and not nan
            ok &= passed
            print(f"check {cid:18s} {'PASS' if passed else 'FAIL'} rel_err(o)={err:.2e} rel_err(rows)={row_err:.2e} "
                  f"nan={nan} sizes={s}", flush=True)
            rows.append(dict(case=cid, variant=c["variant"], max_rel_err=err, row_rel_err=row_err, nan=nan,
                             passed=passed, sizes=s, ptxas=km.get("ptxas")))
        except Exception as e:  # a failure is a row, never a silent skip
            ok = False
            print(f"check {cid:18s} FAIL {type(e).__name__}: {e}", flush=True)
            rows.append(dict(case=cid, passed=False, error=f"{type(e).__name__}: {e}"))
    return ok, rows


# ------------------------------------------------------------------ benchmark
def bench(fn):
    import triton
    return triton.testing.do_bench(fn, warmup=50, rep=200, return_mode="median")


def flops_fwd(w):
    f = 2.0 * w["b"] * w["h"] * w["sq"] * w["skv"] * (w["dqk"] + w["dv"])
    return f / 2 if w["causal"] and w["sq"] == w["skv"] else f


def run_bench(cases_dir, index, workloads):
    from torch.nn.attention import sdpa_kernel, SDPBackend
    rows = []
    wl = {w["id"]: w for w in workloads["workloads"]}

    def record(work, impl, ms, fl, err=None, template=None, error=None):
        row = dict(workload=work, **{"pass": "fwd"}, impl=impl)
        if template:
            row["template"] = template
        if error is not None:
            row["error"] = error
            print(f"bench {work:42s} {impl:14s} ERROR {error}", flush=True)
        else:
            row.update(ms=ms, tflops=fl / (ms * 1e-3) / 1e12)
            if err is not None:
                row["max_rel_err"] = err
            print(f"bench {work:42s} {impl:14s} {ms:8.4f} ms {row['tflops']:7.1f} TF/s"
                  + (f" err={err:.2e}" if err is not None else ""), flush=True)
        rows.append(row)
        return row

    for entry in index["bench"]:
        work = entry["workload"]
        w = wl[work]
        fl = flops_fwd(w)
        b, h, hkv, sq, skv, dqk, dv = w["b"], w["h"], w["hkv"], w["sq"], w["skv"], w["dqk"], w["dv"]
        torch.manual_seed(0)
        q = torch.randn(b, h, sq, dqk, device=dev, dtype=torch.bfloat16)
        k = torch.randn(b, hkv, skv, dqk, device=dev, dtype=torch.bfloat16)
        v = torch.randn(b, hkv, skv, dv, device=dev, dtype=torch.bfloat16)
        scale = 1 / math.sqrt(dqk)
        causal = w["causal"]
        anchors = {}
        if w["variant"] == "softmax":
            for nm, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("fa2", SDPBackend.FLASH_ATTENTION)):
                def f(be=be):
                    with sdpa_kernel([be]):
                        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=hkv != h)
                anchors[nm] = f
        else:
            kind = w["variant"]

            def eager():
                sc = (q @ k.transpose(-1, -2)) * scale
                p = torch.sigmoid(sc - math.log(skv)) if kind == "sigmoid" else torch.relu(sc) / skv
                return p @ v
            anchors["eager"] = eager
            anchors["torch.compile"] = torch.compile(eager)
        ref = None
        for nm, f in anchors.items():
            try:
                out = f()
                if ref is None:
                    ref = out.float()
                record(work, nm, bench(f), fl, err=rel_err(out.float(), ref))
            except Exception as e:
                record(work, nm, None, fl, error=f"{type(e).__name__}: {str(e).splitlines()[0][:120]}")
        if "error" in entry:
            record(work, "aec", None, fl, template="sm80", error=entry["error"])
            continue
        try:
            kern = Kernel(cases_dir, entry["kernel"])
            sizes = dict(B=b, H=h, Hkv=hkv, Sq=sq, Skv=skv)
            o, _ = kern(q, k, v, {}, sizes)
            torch.cuda.synchronize()
            err = rel_err(o.float(), ref) if ref is not None else None
            record(work, "aec", bench(lambda: kern(q, k, v, {}, sizes)), fl, err=err, template="sm80")
        except Exception as e:
            record(work, "aec", None, fl, template="sm80", error=f"{type(e).__name__}: {e}")
        del q, k, v
        torch.cuda.empty_cache()
    return rows


def main():
    args = sys.argv[1:]
    cases_dir = args[0]
    only = set(args[args.index("--only") + 1].split(",")) if "--only" in args else None
    index = json.load(open(os.path.join(cases_dir, "index.json")))
    torch.zeros(1, device=dev)  # create PyTorch's context; our modules load into it
    ok, checks = run_cases(cases_dir, index, only)
    rows = []
    if "--no-bench" not in args:
        workloads = json.load(open(os.path.join(cases_dir, "workloads.json")))
        rows = run_bench(cases_dir, index, workloads)
    result = dict(device=torch.cuda.get_device_name(), date=datetime.date.today().isoformat(),
                  commit=os.environ.get("AEC_COMMIT", "unknown"),
                  command=os.environ.get("AEC_COMMAND", "python bench/gpu_check.py " + " ".join(args)),
                  torch=torch.__version__, checks=checks, rows=rows)
    name = "results.json" if "--no-bench" not in args else "checks.json"
    with open(os.path.join(OUT, name), "w") as fh:
        json.dump(result, fh, indent=1)
    print("all checks passed" if ok else "SOME CHECKS FAILED", flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
