"""GPU check and benchmark of aec's generated kernels, on a GPU machine.

    python bench/gpu_check.py <cases_dir> [--only id,id] [--no-bench] [--bench-only id,id] [--rounds N] [--round-tiles tag,tag]

<cases_dir> is what `aec-bench <cases_dir> --nvrtc` (or `--nvcc …`) wrote: per correctness
case the kernel (cubin), bf16 inputs and the f64 reference interpreter's
outputs; per benchmark workload a kernel. Our kernels are loaded through the
CUDA driver (ctypes) into PyTorch's context, so they run in the same process,
on the same tensors and with the same timing method (triton's do_bench,
median) as the anchors. Results go to $OUT/results.json in the format of
shared/design.md §11. Decoding rows (graph-timed) also give their K/V bytes
per second against the 1 GiB device copy (`copy_fraction`) and against the
read floor of the same bytes (`read_floor_fraction`; a "read floor" row per
decoding workload times `read_floor.bulk_floor_ms`, a bulk read that does
nothing else): at tens of megabytes the floor is well below the copy rate.
"""
import ctypes, datetime, json, math, os, re, sys
import torch
import torch.nn.functional as F

# The launch plans' size expressions, as the kernel libraries' module reads them.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "templates", "library"))
from aec_library import eval_size, split_cost  # noqa: E402

OUT = os.environ.get("OUT", "/tmp/aec-out")
os.makedirs(OUT, exist_ok=True)
dev = "cuda"

libcuda = ctypes.CDLL("libcuda.so.1")
libcuda.cuModuleLoadData.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p]
libcuda.cuModuleGetFunction.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_char_p]
libcuda.cuFuncSetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
libcuda.cuOccupancyMaxActiveBlocksPerMultiprocessor.argtypes = [
    ctypes.POINTER(ctypes.c_int), ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
libcuda.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8


def template_of(*metas):
    """Which template our kernels came from (their entry names say it):
    `sm80` (mma.sync) or `sm90a-wgmma` (plus `-ws` where warp-specialised,
    `-dv/N` where Dv is split between N blocks; backward: `-m32` on 32-query
    steps, `-m80` on 80-query steps with dQ transposed, `-dq64` with those paired for dQ, `-dqlag` with each step's dQ a step late, `-shared-keys` with both warpgroups on 64 keys, `-gN` in N blocks
    per key block, `-xs` with the scores shared between them); forward and
    backward joined with `+` where they differ."""
    names = []
    for m in metas:
        if not isinstance(m, dict):
            continue
        n = m.get("name") or next((l["name"] for l in m.get("launches", []) if l["name"].endswith("_main")), "")
        t = "sm90a-wgmma-ws" if re.search(r"_wgmma(_xs)?_ws", n) else "sm90a-wgmma" if "_wgmma" in n else "sm80"
        if re.search(r"_m32w\d+(s\d+)?(g\d+)?_wgmma", n):
            t += "-m32"  # backward on 32-query steps
        if re.search(r"_m80w\d+_wgmma", n):
            t += "-m80"  # backward on 80-query steps, dQ transposed
        if "_dq64" in n:
            t += "-dq64"  # its steps paired for one 64-row dQ
        if "_dqlag" in n:
            t += "-dqlag"  # each step's dQ at the top of the next
        split_keys = re.search(r"w\d+s2(g\d+)?_wgmma", n)
        if split_keys:
            t += "-shared-keys"  # backward: both warpgroups on 64 keys
            if split_keys.group(1):
                t += "-" + split_keys.group(1)
        if "_wgmma_xs" in n:
            t += "-xs"
        split = re.search(r"_v(\d+)$", n)
        if split:
            t += f"-dv/{split.group(1)}"  # Dv split between blocks
        if t not in names:
            names.append(t)
    return "+".join(names) or "sm80"


def check(res, what):
    if res != 0:
        name = ctypes.c_char_p()
        libcuda.cuGetErrorName(res, ctypes.byref(name))
        raise RuntimeError(f"{what}: {name.value.decode() if name.value else res}")


def load_module(cases_dir, cubin):
    """A cubin loaded into the current (PyTorch's) context."""
    module = ctypes.c_void_p()
    data = open(os.path.join(cases_dir, cubin), "rb").read()
    check(libcuda.cuModuleLoadData(ctypes.byref(module), data), "cuModuleLoadData")
    return module


def get_function(module, name, smem_bytes):
    """An entry point, opted in to `smem_bytes` of dynamic shared memory."""
    fn = ctypes.c_void_p()
    check(libcuda.cuModuleGetFunction(ctypes.byref(fn), module, name.encode()), "cuModuleGetFunction " + name)
    if smem_bytes > 0:
        check(libcuda.cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem_bytes),
              "cuFuncSetAttribute")
    return fn


class TensorMap(ctypes.Structure):
    _fields_ = [("words", ctypes.c_uint64 * 16)]


_tensor_maps = {}


def tensor_map(t, dims, box):
    """A CUtensorMap of bf16 `t` as TensorMapPlan describes (rank 3, 128-byte
    swizzle, zeros outside), cached by address and shape; its storage is
    64-byte aligned, as the encoder requires."""
    key = (t.data_ptr(), tuple(dims), tuple(box))
    if key not in _tensor_maps:
        buf = ctypes.create_string_buffer(ctypes.sizeof(TensorMap) + 128)
        m = TensorMap.from_address((ctypes.addressof(buf) + 127) & ~127)
        check(libcuda.cuTensorMapEncodeTiled(
            ctypes.byref(m), 9, 3, ctypes.c_void_p(t.data_ptr()), (ctypes.c_uint64 * 3)(*dims),
            (ctypes.c_uint64 * 2)(dims[0] * 2, dims[0] * dims[1] * 2), (ctypes.c_uint32 * 3)(*box),
            (ctypes.c_uint32 * 3)(1, 1, 1), 0, 3, 2, 0), "cuTensorMapEncodeTiled")
        _tensor_maps[key] = (m, buf)
    return _tensor_maps[key][0]


class Kernel:
    """A generated forward kernel loaded from its cubin."""

    def __init__(self, cases_dir, meta):
        self.meta = meta
        self.module = load_module(cases_dir, meta["cubin"])
        self.fn = get_function(self.module, meta["name"], meta["smem_bytes"])
        self.combine = get_function(self.module, meta["combine"], 0) if meta.get("combine") else None
        props = torch.cuda.get_device_properties(dev)
        self.sms = props.multi_processor_count
        # Blocks one SM holds at once by the driver (registers included):
        # the split rule's wave cap, as the runtime and the loaders read it.
        resident = ctypes.c_int(0)
        check(libcuda.cuOccupancyMaxActiveBlocksPerMultiprocessor(
            ctypes.byref(resident), self.fn, meta["threads"], meta["smem_bytes"]),
            "cuOccupancyMaxActiveBlocksPerMultiprocessor " + meta["name"])
        self.resident = resident.value
        self.splits_override = None  # an int forces the number of KV splits
        # "main" or "combine": that launch of a split-KV call is left out
        # (decode_ab.py --parts times each alone; the outputs are then wrong).
        self.skip_launch = None

    def grid(self, sizes):
        """KernelSource::grid_for: the row blocks (times Dv slices), heads, batch."""
        bm, split = self.meta["block_m"], self.meta.get("dv_split", 1)
        b, h, sq = sizes["B"], sizes["H"], sizes["Sq"]
        if self.meta.get("packed_gqa"):
            hkv = sizes["Hkv"]
            return ((h // hkv * sq + bm - 1) // bm * split, hkv, b)
        return ((sq + bm - 1) // bm * split, h, b)

    def launch_grid(self, sizes, n_splits):
        """KernelSource::launch_grid: a persistent kernel walks units of two
        row blocks with at most one block per multiprocessor."""
        x, y, z = self.grid(sizes)
        if not self.meta.get("persistent"):
            return x * n_splits, y, z
        split = self.meta.get("dv_split", 1)
        if self.meta.get("tile_schedule"):
            units = x * y * z  # row blocks one by one
        else:
            units = ((x // split) + 1) // 2 * split * y * z
        if self.meta.get("cluster_pairs"):
            # Clusters of two: an even grid, a cluster per two SMs.
            return 2 * min((units + 1) // 2, self.sms // 2), 1, 1
        return min(units, self.sms), 1, 1

    def kv_splits(self, sizes):
        """KernelSource::kv_splits (compiler/src/cuda/forward/source.rs), the same rule:
        the splits within one wave of resident blocks for which the busiest SM
        finishes first (split_cost, with the kernel's K/V bytes in flight and
        fixed work per block), the fewest among equals."""
        if not self.meta.get("split_kv", self.combine is not None):
            return 1
        if self.splits_override:
            return self.splits_override
        x, y, z = self.grid(sizes)
        blocks = x * y * z
        if blocks >= 2 * self.sms:
            return 1
        key_blocks = (sizes["Skv"] + self.meta["block_n"] - 1) // self.meta["block_n"]
        top = min(max(key_blocks // 4, 1), 128, max(1, self.resident * self.sms // blocks))
        in_flight = self.meta.get("kv_bytes_in_flight", 0)
        fixed = self.meta.get("split_fixed_work", 0)
        return min(range(1, top + 1), key=lambda s: (
            split_cost(blocks, key_blocks, s, self.sms, self.resident, in_flight, fixed), s))

    def __call__(self, q, k, v, customs, sizes, extra=None, o_fill=None):
        """`extra`: the values of the arguments of other row layouts (a paged
        cache's `block_table`, ...), ctypes values by name. `o_fill`: a value
        to fill the output with before the launch (NaN in checks: rows a
        kernel skips then show, where reused memory could hold an earlier
        launch's right answer)."""
        # (With V stored in K, `v` is the cache itself: Dv is the kernel's.)
        b, h, sq, dv = sizes["B"], sizes["H"], sizes["Sq"], self.meta.get("dv") or v.shape[-1]
        for name, t in (("q", q), ("k", k), ("v", v)):
            assert t.is_contiguous() and t.dtype == torch.bfloat16, f"tensor `{name}` must be contiguous bf16"
        o = torch.empty(b, h, sq, dv, device=dev, dtype=torch.bfloat16)
        if o_fill is not None:
            o.fill_(o_fill)
        rowout = torch.empty(max(1, len(self.meta["row_outputs"])), b * h * sq, device=dev, dtype=torch.float32)
        n_splits = self.kv_splits(sizes)
        rows = b * h * sq
        work = dict(opart=torch.empty(max(1, n_splits * rows * dv if n_splits > 1 else 1), device=dev, dtype=torch.float32),
                    spart=torch.empty(max(1, n_splits * rows * self.meta.get("split_state_words", 1) if n_splits > 1 else 1),
                                      device=dev, dtype=torch.float32))
        if self.meta.get("tile_schedule"):
            # One ticket counter for this kernel's launches, which follow each
            # other on the stream: zero at the first, and each leaves it zero.
            if getattr(self, "tile_counter", None) is None:
                self.tile_counter = torch.zeros(1, device=dev, dtype=torch.int32)
            work["tile_counter"] = self.tile_counter
        if any(a.get("name") == "split_count" for a in self.meta["args"]):
            # The row blocks' counters of a kernel that merges its own splits:
            # zero at the first launch, and each launch leaves them zero.
            x, y, z = self.grid(sizes)
            if getattr(self, "split_count", None) is None or self.split_count.numel() < x * y * z:
                self.split_count = torch.zeros(x * y * z, device=dev, dtype=torch.int32)
            work["split_count"] = self.split_count
        vals = []
        for a in self.meta["args"]:
            kind = a["kind"]
            if kind == "tensor":
                vals.append(ctypes.c_uint64({"q": q, "k": k, "v": v, "o": o}[a["name"]].data_ptr()))
            elif kind == "rowout":
                vals.append(ctypes.c_uint64(rowout.data_ptr()))
            elif kind == "custom":
                vals.append(ctypes.c_uint64(customs[a["name"]].data_ptr()))
            elif kind == "workspace":
                vals.append(ctypes.c_uint64(work[a["name"]].data_ptr()))
            elif kind == "kv_splits":
                vals.append(ctypes.c_int32(n_splits))
            elif kind in ("paged", "block_mask"):
                vals.append(extra[a["name"]])
            elif kind == "tensor_map":
                t = {"q": q, "k": k, "v": v}[a["name"]]
                vals.append(tensor_map(t, [eval_size(d, sizes) for d in a["dims"]], a["box"]))
            else:
                vals.append(ctypes.c_int32(sizes[a["axis"]]))
        params = (ctypes.c_void_p * len(vals))(*[ctypes.cast(ctypes.byref(x), ctypes.c_void_p) for x in vals])
        stream = torch.cuda.current_stream().cuda_stream
        x, y, z = self.launch_grid(sizes, n_splits)
        if self.skip_launch != "main":
            check(libcuda.cuLaunchKernel(self.fn, x, y, z, self.meta["threads"], 1, 1,
                                         self.meta["smem_bytes"], ctypes.c_void_p(stream), params, None), "cuLaunchKernel")
        if n_splits > 1 and self.combine is not None and self.skip_launch != "combine":
            per = self.meta["combine_rows_per_block"]
            check(libcuda.cuLaunchKernel(self.combine, (rows + per - 1) // per, 1, 1, self.meta["combine_threads"], 1, 1, 0,
                                         ctypes.c_void_p(stream), params, None), "cuLaunchKernel combine")
        self.last_splits = n_splits
        return o, rowout


class BackwardKernel:
    """The three generated backward kernels (pre, main, post) of one cubin."""

    def __init__(self, cases_dir, meta):
        self.meta = meta
        self.module = load_module(cases_dir, meta["cubin"])
        self.fns = [(get_function(self.module, l["name"], l["smem_bytes"]), l) for l in meta["launches"]]

    def __call__(self, q, k, v, o, dout, rowout, customs, sizes, cu_q=None, cu_k=None, only=None):
        """With `cu_q`, `cu_k`: the backward of a packed variable-length batch
        (q, k, v packed `[H, T, D]`; `sizes` B = sequences, Sq/Skv the
        longest): the row kernels cover the packed rows. With `only` (0, 1
        or 2): that launch alone (pre, main, post), for timing."""
        b, h, hkv, sq, skv = sizes["B"], sizes["H"], sizes["Hkv"], sizes["Sq"], sizes["Skv"]
        dqk, dv = self.meta["dqk"], self.meta["dv"]
        rows = q.numel() // dqk if cu_q is not None else b * h * sq
        bufs = dict(q=q, k=k, v=v, o=o, dout=dout,
                    dot=torch.empty(rows, device=dev, dtype=torch.float32),
                    qmod=torch.empty(rows * dqk, device=dev, dtype=torch.bfloat16),
                    dq_acc=torch.empty(rows * dqk, device=dev, dtype=torch.float32),
                    dq=torch.empty(q.shape, device=dev, dtype=q.dtype), dk=torch.empty(k.shape, device=dev, dtype=k.dtype),
                    dv=torch.empty(v.shape, device=dev, dtype=v.dtype))
        grads = {n: torch.zeros_like(t) for n, t in customs.items()}
        vals = []
        for a in self.meta["args"]:
            kind = a["kind"]
            if kind in ("tensor", "workspace"):
                vals.append(ctypes.c_uint64(bufs[a["name"]].data_ptr()))
            elif kind == "rowout":
                vals.append(ctypes.c_uint64(rowout.data_ptr()))
            elif kind == "custom":
                vals.append(ctypes.c_uint64(customs[a["name"]].data_ptr()))
            elif kind == "custom_grad":
                vals.append(ctypes.c_uint64(grads[a["name"]].data_ptr()))
            elif kind in ("cu_seqlens", "cu_seqlens_k"):
                vals.append(ctypes.c_uint64((cu_q if kind == "cu_seqlens" else cu_k).data_ptr()))
            elif kind == "tensor_map":
                vals.append(tensor_map(bufs[a["name"]], [eval_size(d, sizes) for d in a["dims"]], a["box"]))
            else:
                vals.append(ctypes.c_int32(sizes[a["axis"]]))
        params = (ctypes.c_void_p * len(vals))(*[ctypes.cast(ctypes.byref(x), ctypes.c_void_p) for x in vals])
        stream = torch.cuda.current_stream().cuda_stream
        for idx, (fn, l) in enumerate(self.fns):
            if only is not None and idx != only:
                continue
            g = l["grid"]
            if g["kind"] == "rows":
                grid = ((rows + g["per_block"] - 1) // g["per_block"], 1, 1)
            elif g["kind"] == "key_blocks":
                grid = ((skv + g["block_n"] - 1) // g["block_n"] * g.get("groups", 1), hkv, b)
            else:
                grid = ((rows * dqk + g["per_block"] - 1) // g["per_block"], 1, 1)
            check(libcuda.cuLaunchKernel(fn, *grid, l["threads"], 1, 1, l["smem_bytes"], ctypes.c_void_p(stream),
                                         params, None), "cuLaunchKernel " + l["name"])
        return bufs["dq"], bufs["dk"], bufs["dv"], grads


def load_bin(path, dtype, shape):
    data = bytearray(open(path, "rb").read())
    return torch.frombuffer(data, dtype=dtype).reshape(shape).to(dev)


def workloads_by_id(cases_dir, index):
    """The workloads of <cases_dir>/workloads.json and the index's
    `extra_workloads` (aec-bench's own), by id."""
    listed = json.load(open(os.path.join(cases_dir, "workloads.json")))["workloads"]
    return {w["id"]: w for w in listed + index.get("extra_workloads", [])}


def workload_customs(w):
    """The custom inputs of workload w's variant: RetNet's per-head decays
    1 - 2^(-5 - h·4/H) (its multi-scale retention), the example's one custom
    input; none for the others."""
    if w["variant"] == "retnet_parallel":
        return {"gamma": 1 - 2.0 ** (-5 - torch.arange(w["h"], device=dev, dtype=torch.float32) * 4 / w["h"])}
    return {}


def backward_inputs(w):
    """Random bf16 q, k, v and dO of workload `w` (seed 0), as the backward
    tools draw them."""
    b, h, hkv, sq, skv, dqk, dv = w["b"], w["h"], w["hkv"], w["sq"], w["skv"], w["dqk"], w["dv"]
    torch.manual_seed(0)
    q = torch.randn(b, h, sq, dqk, device=dev, dtype=torch.bfloat16)
    k = torch.randn(b, hkv, skv, dqk, device=dev, dtype=torch.bfloat16)
    v = torch.randn(b, hkv, skv, dv, device=dev, dtype=torch.bfloat16)
    do = torch.randn(b, h, sq, dv, device=dev, dtype=torch.bfloat16)
    return q, k, v, do


def cudnn_kept_forward(w, q, k, v):
    """cuDNN's SDPA forward of workload `w` on leaf copies of q, k, v, kept
    for repeated `torch.autograd.grad`: (out, leaves)."""
    from torch.nn.attention import sdpa_kernel, SDPBackend
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        out = F.scaled_dot_product_attention(*leaves, is_causal=w["causal"],
                                             scale=w.get("scale", 1 / math.sqrt(w["dqk"])),
                                             enable_gqa=w["hkv"] != w["h"])
    return out, leaves


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
            # Split-KV kernels: the launch rule's choice, then forced splits
            # (one; three; eight, which leaves some splits without keys).
            runs = [None] + ([1, 3, 8] if kern.combine is not None else [])
            for forced in runs:
                kern.splits_override = forced
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
                name = cid if kern.combine is None else f"{cid}@{kern.last_splits}kv"
                print(f"check {name:18s} {'PASS' if passed else 'FAIL'} rel_err(o)={err:.2e} rel_err(rows)={row_err:.2e} "
                      f"nan={nan} sizes={s}", flush=True)
                rows.append(dict(case=name, variant=c["variant"], max_rel_err=err, row_rel_err=row_err, nan=nan,
                                 passed=passed, sizes=s, ptxas=km.get("ptxas"), kv_splits=kern.last_splits))
        except Exception as e:  # a failure is a row, never a silent skip
            ok = False
            print(f"check {cid:18s} FAIL {type(e).__name__}: {e}", flush=True)
            rows.append(dict(case=cid, passed=False, error=f"{type(e).__name__}: {e}"))
    return ok, rows


# ------------------------------------------------------------------ benchmark
def bench(fn):
    import triton
    return triton.testing.do_bench(fn, warmup=50, rep=200, return_mode="median")


def bench_graph(call, n_sets, calls=24, replays=15):
    """Milliseconds per call of `call(i)` (input set `i % n_sets`), timed as
    CUDA-graph replays of `calls` calls: decoding kernels run for tens of
    microseconds, where timing each launch from Python measures the host
    (the same kernel read 0.055 to 0.084 ms between rows of one run). Serving
    stacks replay decoding steps as graphs too. Rotating input sets keep the
    bytes read per replay above the L2 cache's size, so no call finds its
    predecessor's cache in L2."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(2 * n_sets):
            call(i % n_sets)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            call(i % n_sets)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    del graph
    return sorted(times)[len(times) // 2]


# Bytes a decoding benchmark's rotating input sets span at least (H100 and
# H200 have 50 MB of L2).
GRAPH_SET_BYTES = 256 << 20

# Interleaved rounds (`--rounds N`, default 3; 1: none) of a decoding
# workload's anchors and default kernel, and of cuDNN and ours for the
# prefill forward and forward+backward rows ("… (rounds)" rows).
ROUNDS = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 3
# Decoding tiles (`--round-tiles m16k4n64s3,ck`: their tags) timed in those
# rounds too.
ROUND_TILES = sys.argv[sys.argv.index("--round-tiles") + 1].split(",") if "--round-tiles" in sys.argv else []


def flops_fwd(w):
    if w.get("window"):
        # Visible pairs of a causal window over a square sequence.
        win, s = w["window"], w["sq"]
        pairs = win * s - win * (win - 1) / 2
        return 2.0 * w["b"] * w["h"] * pairs * (w["dqk"] + w["dv"])
    f = 2.0 * w["b"] * w["h"] * w["sq"] * w["skv"] * (w["dqk"] + w["dv"])
    return f / 2 if w["causal"] and w["sq"] == w["skv"] else f


def copy_bandwidth():
    """Device-to-device copy of 1 GiB (read + write), GB/s."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    ms = bench(lambda: dst.copy_(src))
    del src, dst
    return 2 * (1 << 30) / (ms * 1e-3) / 1e9


_flex = None


def flex_anchor(q, k, v, causal, scale, gqa, window=None):
    """FlexAttention, compiled, with the causal (or causal window) mask as a block mask."""
    global _flex
    from torch.nn.attention.flex_attention import flex_attention, create_block_mask
    if _flex is None:
        # One compiled function serves every workload: without a larger
        # cache dynamo stops recompiling after 8 shapes and Flex falls back
        # to its slow unfused path.
        torch._dynamo.config.cache_size_limit = 256
        torch._dynamo.config.accumulated_cache_size_limit = 4096
        _flex = torch.compile(flex_attention)
    sq, skv = q.shape[2], k.shape[2]
    if window:
        mask = create_block_mask(lambda b, h, i, j: (i >= j) & (i - j < window), None, None, sq, skv, device=dev)
    elif causal:
        mask = create_block_mask(lambda b, h, i, j: i >= j, None, None, sq, skv, device=dev)
    else:
        mask = None

    def f(qq=q, kk=k, vv=v):
        return _flex(qq, kk, vv, block_mask=mask, scale=scale, enable_gqa=gqa)
    return f


def run_bench(cases_dir, index, workloads):
    from torch.nn.attention import sdpa_kernel, SDPBackend
    rows = []
    wl = {w["id"]: w for w in workloads["workloads"] + index.get("extra_workloads", [])}

    copy_gbps = copy_bandwidth()
    floors = {}  # decoding workload -> its read floor, ms per call
    print(f"device-to-device copy: {copy_gbps:.0f} GB/s", flush=True)
    rows.append(dict(workload="copy", impl="torch copy_ (1 GiB)", gbps=copy_gbps))

    def record(work, impl, ms, fl, err=None, template=None, error=None, pas="fwd", timing=None):
        row = dict(workload=work, **{"pass": pas}, impl=impl)
        if timing:
            row["timing"] = timing
        if template:
            row["template"] = template
        if error is not None:
            row["error"] = error
            print(f"bench {work:42s} {pas:7s} {impl:14s} ERROR {error}", flush=True)
        else:
            row.update(ms=ms, tflops=fl / (ms * 1e-3) / 1e12)
            w = wl.get(work, {})
            if w.get("sq") == 1:
                # Decoding is bound by reading the KV cache: bytes moved per
                # call against the copy bandwidth measured above.
                kv_cols = w["dqk"] if w.get("v_in_k") else w["dqk"] + w["dv"]  # V stored in K: one cache
                nbytes = 2 * w["b"] * (w["hkv"] * w["skv"] * kv_cols + w["h"] * (w["dqk"] + w["dv"]))
                row.update(gbps=nbytes / (ms * 1e-3) / 1e9, copy_fraction=nbytes / (ms * 1e-3) / 1e9 / copy_gbps)
                if floors.get(work):
                    # Against the fastest plain read of the same K/V bytes
                    # (read_floor.bulk_floor_ms): what any kernel could reach.
                    row["read_floor_fraction"] = floors[work] / ms
            if err is not None:
                row["max_rel_err"] = err
            print(f"bench {work:42s} {pas:7s} {impl:14s} {ms:8.4f} ms {row['tflops']:7.1f} TF/s"
                  + (f" err={err:.2e}" if err is not None else "")
                  + (f" {row['gbps']:.0f} GB/s = {row['copy_fraction']:.2f} of copy" if "gbps" in row else "")
                  + (f", {row['read_floor_fraction']:.2f} of the read floor" if "read_floor_fraction" in row else ""),
                  flush=True)
        rows.append(row)
        return row

    for entry in index["bench"]:
        # (The rows of the workloads done so far, kept where a run stops at
        # its time limit.)
        with open(os.path.join(OUT, "rows.partial.json"), "w") as fh:
            json.dump(rows, fh, indent=1)
        work = entry["workload"]
        w = wl[work]
        fl = flops_fwd(w)
        b, h, hkv, sq, skv, dqk, dv = w["b"], w["h"], w["hkv"], w["sq"], w["skv"], w["dqk"], w["dv"]
        torch.manual_seed(0)
        q = torch.randn(b, h, sq, dqk, device=dev, dtype=torch.bfloat16)
        k = torch.randn(b, hkv, skv, dqk, device=dev, dtype=torch.bfloat16)
        # V stored in K (the latent cache): the anchors see its first Dv
        # columns as v, our kernel the cache alone.
        v = k[..., :dv] if w.get("v_in_k") else torch.randn(b, hkv, skv, dv, device=dev, dtype=torch.bfloat16)
        decode = sq == 1
        sets = [(q, k, v)]
        if decode:
            # More input sets where one is small against L2 (bench_graph).
            per_set = sum(t.numel() * t.element_size() for t in (q, k)) + (0 if w.get("v_in_k") else v.numel() * 2)
            for _ in range(max(0, -(-GRAPH_SET_BYTES // per_set) - 1)):
                kx = torch.randn_like(k)
                sets.append((torch.randn_like(q), kx, kx[..., :dv] if w.get("v_in_k") else torch.randn_like(v)))

        if decode:
            # The read floor of this call's K/V bytes (the cache once where V
            # is stored in K), timed over the same input sets.
            try:
                from read_floor import bulk_floor_ms
                if w.get("v_in_k"):
                    half = k.numel() * k.element_size() // 2
                    pairs = [(kk.data_ptr(), kk.data_ptr() + half) for _, kk, _ in sets]
                    floor = bulk_floor_ms(pairs, half, half)
                else:
                    pairs = [(kk.data_ptr(), vv.data_ptr()) for _, kk, vv in sets]
                    floor = bulk_floor_ms(pairs, k.numel() * k.element_size(), v.numel() * v.element_size())
                floors[work] = floor
                record(work, "read floor", floor, fl, timing="cuda graph, bulk copies (bench/read_floor.py)")
            except Exception as e:
                record(work, "read floor", None, fl, error=f"{type(e).__name__}: {e}")

        def timed(f):
            """`f(qq, kk, vv)` timed: graph replays over the input sets for
            decoding, triton's do_bench (launch by launch) otherwise."""
            if decode:
                try:
                    return bench_graph(lambda i: f(*sets[i]), len(sets)), "cuda graph"
                except Exception as e:  # an anchor that cannot be captured
                    torch.cuda.synchronize()
                    return bench(lambda: f(q, k, v)), f"launches (capture failed: {type(e).__name__})"
            return bench(lambda: f(q, k, v)), None

        def record_timed(impl, f, **kw):
            ms, timing = timed(f)
            return record(work, impl, ms, fl, timing=timing, **kw)
        scale = w.get("scale", 1 / math.sqrt(dqk))
        causal = w["causal"]
        anchors = {}
        customs = workload_customs(w)
        if w.get("window"):
            anchors["flex"] = flex_anchor(q, k, v, causal, scale, hkv != h, window=w["window"])
        elif w["variant"] == "softmax":
            for nm, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("fa2", SDPBackend.FLASH_ATTENTION)):
                def f(qq=q, kk=k, vv=v, be=be):
                    with sdpa_kernel([be]):
                        return F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal, scale=scale,
                                                              enable_gqa=hkv != h)
                anchors[nm] = f
            if "flex" in w.get("anchors", []):
                anchors["flex"] = flex_anchor(q, k, v, causal, scale, hkv != h)
        elif w["variant"] == "mla_decode":
            # No library decodes MLA here (FlashMLA is not installed): cuDNN
            # and FA2 are tried for the record, then Flex and PyTorch.
            for nm, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("fa2", SDPBackend.FLASH_ATTENTION)):
                def f(qq=q, kk=k, vv=v, be=be):
                    with sdpa_kernel([be]):
                        return F.scaled_dot_product_attention(qq, kk, vv, scale=scale, enable_gqa=True)
                anchors[nm] = f
            anchors["flex"] = flex_anchor(q, k, v, False, scale, True)

            def eager(qq=q, kk=k, vv=v):
                # The query heads of a KV head as rows of one bf16 GEMM each.
                bq, hq, sqq, d = qq.shape
                hk = kk.shape[1]
                qg = qq.reshape(bq, hk, hq // hk * sqq, d)
                p = torch.softmax((qg @ kk.transpose(-1, -2)).float() * scale, -1).to(qq.dtype)
                return (p @ vv).reshape(bq, hq, sqq, vv.shape[-1])
            anchors["eager"] = eager
            anchors["torch.compile"] = torch.compile(eager)
        elif w["variant"] == "retnet_parallel":
            log_gamma = customs["gamma"].log()

            def eager(qq=q, kk=k, vv=v):
                # examples/retnet_parallel.rs: (Q Kᵀ ⊙ D) V over max(Σ_j |Q Kᵀ ⊙ D|, 1),
                # D_ij = γ^(i-j) for i >= j, the decay computed from the positions
                # (torch.compile fuses it into the score pass).
                pos = torch.arange(sq, device=dev)
                diff = (pos[:, None] - pos[None, :]).float()
                decay = torch.where(diff >= 0, torch.exp(diff * log_gamma[:, None, None]), 0.0)
                sc = (qq @ kk.transpose(-1, -2)) * decay.to(qq.dtype)
                a = sc.float().abs().sum(-1, keepdim=True).clamp(min=1.0)
                return ((sc @ vv).float() / a).to(qq.dtype)
            anchors["eager"] = eager
            anchors["torch.compile"] = torch.compile(eager)
        else:
            kind = w["variant"]

            def eager(qq=q, kk=k, vv=v):
                sc = (qq @ kk.transpose(-1, -2)) * scale
                p = torch.sigmoid(sc - math.log(skv)) if kind == "sigmoid" else torch.relu(sc) / skv
                return p @ vv
            anchors["eager"] = eager
            anchors["torch.compile"] = torch.compile(eager)
        ref = None
        for nm, f in anchors.items():
            try:
                out = f()
                if ref is None:
                    ref = out.float()
                record_timed(nm, f, err=rel_err(out.float(), ref))
            except Exception as e:
                record(work, nm, None, fl, error=f"{type(e).__name__}: {str(e).splitlines()[0][:120]}")
        if "error" in entry:
            record(work, "aec", None, fl, template=template_of(entry.get("kernel")), error=entry["error"])
            continue
        try:
            kern = Kernel(cases_dir, entry["kernel"])
            sizes = dict(B=b, H=h, Hkv=hkv, Sq=sq, Skv=skv)
            kv = k if w.get("v_in_k") else v  # the kernel reads V from k's rows
            o, _ = kern(q, k, kv, customs, sizes)
            torch.cuda.synchronize()
            err = rel_err(o.float(), ref) if ref is not None else None
            # With V stored in K the kernel reads V from k's rows.
            def ours(kn):
                return lambda qq, kk, vv: kn(qq, kk, kk if w.get("v_in_k") else vv, customs, sizes)
            row = record_timed("aec", ours(kern), err=err, template=template_of(entry["kernel"]))
            row["kv_splits"] = kern.last_splits
            if not decode and ROUNDS > 1 and "cudnn" in anchors:
                # cuDNN and ours again, alternating, in ROUNDS rounds with the
                # same timing: single timings of either moved by 1-2%
                # between runs (bench/NOTES.md session 66).
                interleaved_rounds(work, fl, {"cudnn": anchors["cudnn"], "aec": lambda: ours(kern)(q, k, v)},
                                   bench, record)
            if entry.get("tiles"):
                # Forced KV splits of the default, then the other tiles.
                for n in (1, 2, 3, 4, 6, 8):
                    kern.splits_override = n
                    o, _ = kern(q, k, kv, customs, sizes)
                    torch.cuda.synchronize()
                    record_timed(f"aec splits={n}", ours(kern),
                           err=rel_err(o.float(), ref) if ref is not None else None, template=template_of(entry["kernel"]))
                kern.splits_override = None
                if decode and ROUNDS > 1:
                    # The anchors and our default again, one after the other,
                    # in ROUNDS rounds: a decoding comparison within a few
                    # tenths of a percent should not hinge on which ran first.
                    extra = {f"aec {t['tiles']}": ours(Kernel(cases_dir, t["kernel"]))
                             for t in entry["tiles"] if t["tiles"] in ROUND_TILES and "kernel" in t}
                    interleaved_rounds(work, fl, anchors | {"aec": ours(kern)} | extra, lambda f: timed(f)[0], record,
                                       timing="cuda graph, interleaved rounds")
                    # Launches that reuse workspaces (counters the kernel
                    # leaves zero) still give the right answer.
                    o, _ = kern(q, k, kv, customs, sizes)
                    torch.cuda.synchronize()
                    row["err_after_timing"] = rel_err(o.float(), ref) if ref is not None else None
                for t in entry["tiles"]:
                    if "error" in t:
                        record(work, f"aec {t['tiles']}", None, fl, error=t["error"])
                        continue
                    tk = Kernel(cases_dir, t["kernel"])
                    o, _ = tk(q, k, kv, customs, sizes)
                    torch.cuda.synchronize()
                    for n in (None, 1, 2, 4):
                        tk.splits_override = n
                        o, _ = tk(q, k, kv, customs, sizes)
                        torch.cuda.synchronize()
                        row = record_timed(f"aec {t['tiles']}" + (f" splits={n}" if n else ""), ours(tk),
                                     err=rel_err(o.float(), ref) if ref is not None else None,
                                     template=template_of(t["kernel"]))
                        row["kv_splits"] = tk.last_splits
        except Exception as e:
            record(work, "aec", None, fl, template=template_of(entry["kernel"]), error=f"{type(e).__name__}: {e}")
        if "fwd+bwd" in w.get("passes", []):
            bench_backward(work, w, entry, cases_dir, q, k, v, customs, anchors, record, fl * 3.5)
        sets.clear()
        del q, k, v
        torch.cuda.empty_cache()
    return rows


def interleaved_rounds(work, fl, fns, timer, record, pas="fwd", timing="interleaved rounds"):
    """`fns` (name -> callable) timed one after the other in ROUNDS rounds,
    recorded as "<name> (rounds)" rows with their median and every round's
    time: `timer(f)` gives milliseconds, or with `timer` None each callable
    times itself. A round that fails leaves no time."""
    times = {nm: [] for nm in fns}
    gpu_state = {nm: [] for nm in fns}
    for _ in range(ROUNDS):
        for nm, f in fns.items():
            try:
                times[nm].append(f() if timer is None else timer(f))
                gpu_state[nm].append(sm_clock_and_power())
            except Exception:
                torch.cuda.synchronize()
    for nm, xs in times.items():
        if xs:
            r = record(work, f"{nm} (rounds)", sorted(xs)[len(xs) // 2], fl, pas=pas, timing=timing)
            r["ms_rounds"] = xs
            if any(gpu_state[nm]):
                # The SM clock (MHz) and board power (W) NVML reports
                # just after each round's timing: under the power cap
                # a round's time follows the clock (bench/NOTES.md
                # session 67).
                r["mhz_rounds"] = [g and g[0] for g in gpu_state[nm]]
                r["watts_rounds"] = [g and g[1] for g in gpu_state[nm]]


def sm_clock_and_power():
    """(SM clock in MHz, board power in W) over NVML's last sample period,
    or None where NVML is not available."""
    try:
        return torch.cuda.clock_rate(), torch.cuda.power_draw() / 1000
    except Exception:
        return None


def bench_backward(work, w, entry, cases_dir, q, k, v, customs, anchors, record, fl):
    """fwd+bwd rows: the anchors through autograd, ours as forward + the three
    backward kernels; our gradients are compared with the first anchor's."""
    b, h, hkv, sq, skv = w["b"], w["h"], w["hkv"], w["sq"], w["skv"]
    torch.manual_seed(1)
    do = torch.randn(b, h, sq, w["dv"], device=dev, dtype=torch.bfloat16)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    ref = None
    for nm, f in anchors.items():
        if nm == "eager" and "torch.compile" in anchors:
            continue
        def fb(f=f):
            out = f(*leaves)
            out.backward(do)
        try:
            fb()
            grads = [t.grad.float().clone() for t in leaves]
            if ref is None:
                ref = grads
            import triton
            ms = triton.testing.do_bench(fb, warmup=20, rep=100, return_mode="median", grad_to_none=leaves)
            record(work, nm, ms, fl, pas="fwd+bwd")
        except Exception as e:
            record(work, nm, None, fl, pas="fwd+bwd", error=f"{type(e).__name__}: {str(e).splitlines()[0][:120]}")
        for t in leaves:
            t.grad = None
    bm = entry.get("backward", {})
    if "error" in entry or "error" in bm or not bm.get("cubin"):
        record(work, "aec", None, fl, template=template_of(entry.get("kernel"), bm), pas="fwd+bwd",
               error=entry.get("error") or bm.get("error") or "no backward cubin")
        return
    try:
        fk = Kernel(cases_dir, entry["kernel"])
        bk = BackwardKernel(cases_dir, bm)
        sizes = dict(B=b, H=h, Hkv=hkv, Sq=sq, Skv=skv)

        def ours():
            o, rowout = fk(q, k, v, customs, sizes)
            return bk(q, k, v, o, do, rowout, customs, sizes)
        dq, dk, dv, _ = ours()
        torch.cuda.synchronize()
        err = None
        if ref is not None:
            err = max(rel_err(x.float(), y) for x, y in zip((dq, dk, dv), ref))
        record(work, "aec", bench(ours), fl, err=err, template=template_of(entry["kernel"], bm), pas="fwd+bwd")
        if ROUNDS > 1 and "cudnn" in anchors:
            # cuDNN's forward+backward read 3.44 to 3.97 ms on one workload
            # between runs while ours moved by 1% (bench/NOTES.md session
            # 66): both again, alternating, timed alike (the single rows
            # above time the anchors over 100 ms, ours over 200).
            import triton

            def cudnn_fb():
                anchors["cudnn"](*leaves).backward(do)
            interleaved_rounds(work, fl, {
                "cudnn": lambda: triton.testing.do_bench(cudnn_fb, warmup=50, rep=200, return_mode="median",
                                                         grad_to_none=leaves),
                "aec": lambda: bench(ours)}, None, record, pas="fwd+bwd")
            for t in leaves:
                t.grad = None
    except Exception as e:
        record(work, "aec", None, fl, template=template_of(entry["kernel"], bm), pas="fwd+bwd",
               error=f"{type(e).__name__}: {e}")


def run_bwd_sweep(cases_dir, index, workloads):
    """Backward alone, per tile configuration, next to FA2's and cuDNN's
    backward alone (autograd.grad on a kept forward) in the same process."""
    from torch.nn.attention import sdpa_kernel, SDPBackend
    rows = []
    wl = {w["id"]: w for w in workloads["workloads"]}
    fwd_entry = {e["workload"]: e for e in index["bench"]}
    for work in sorted({e["workload"] for e in index.get("bwd_sweep", [])}):
        w = wl[work]
        b, h, hkv, sq, skv, dqk, dv = w["b"], w["h"], w["hkv"], w["sq"], w["skv"], w["dqk"], w["dv"]
        fl = 2.5 * flops_fwd(w)
        q, k, v, do = backward_inputs(w)
        ref = None
        for nm, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("fa2", SDPBackend.FLASH_ATTENTION)):
            try:
                leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
                with sdpa_kernel([be]):
                    out = F.scaled_dot_product_attention(*leaves, is_causal=w["causal"], scale=1 / math.sqrt(dqk),
                                                         enable_gqa=hkv != h)
                grads = torch.autograd.grad(out, leaves, do, retain_graph=True)
                if ref is None:
                    ref = [g.float() for g in grads]
                ms = bench(lambda: torch.autograd.grad(out, leaves, do, retain_graph=True))
                rows.append(dict(workload=work, **{"pass": "bwd"}, impl=nm, ms=ms, tflops=fl / (ms * 1e-3) / 1e12))
                print(f"sweep {work:34s} bwd {nm:14s} {ms:8.4f} ms {rows[-1]['tflops']:7.1f} TF/s", flush=True)
            except Exception as ex:  # FA2 has no kernel where Dqk != Dv
                rows.append(dict(workload=work, **{"pass": "bwd"}, impl=nm, error=f"{type(ex).__name__}: {ex}"[:200]))
                print(f"sweep {work:34s} bwd {nm:14s} ERROR {type(ex).__name__}", flush=True)
        fk = Kernel(cases_dir, fwd_entry[work]["kernel"])
        sizes = dict(B=b, H=h, Hkv=hkv, Sq=sq, Skv=skv)
        o, rowout = fk(q, k, v, {}, sizes)
        for e in index["bwd_sweep"]:
            if e["workload"] != work:
                continue
            impl = "aec " + e["config"]
            try:
                if "error" in e["backward"]:
                    raise RuntimeError(e["backward"]["error"])
                bk = BackwardKernel(cases_dir, e["backward"])
                dq, dk, dvv, _ = bk(q, k, v, o, do, rowout, {}, sizes)
                torch.cuda.synchronize()
                err = max(rel_err(x.float(), y) for x, y in zip((dq, dk, dvv), ref))
                ms = bench(lambda: bk(q, k, v, o, do, rowout, {}, sizes))
                rows.append(dict(workload=work, **{"pass": "bwd"}, impl=impl, template=template_of(e["backward"]), ms=ms,
                                 tflops=fl / (ms * 1e-3) / 1e12, max_rel_err=err, ptxas=e["backward"].get("ptxas")))
                # Each launch alone: the row kernel, the main kernel, dQ's conversion.
                parts = [bench(lambda: bk(q, k, v, o, do, rowout, {}, sizes, only=i)) for i in range(len(bk.fns))]
                rows[-1]["launch_ms"] = parts
                print(f"sweep {work:34s} bwd {impl:14s} {ms:8.4f} ms {rows[-1]['tflops']:7.1f} TF/s err={err:.2e}"
                      f" (pre/main/post {' / '.join(f'{x:.4f}' for x in parts)} ms)", flush=True)
            except Exception as ex:
                rows.append(dict(workload=work, **{"pass": "bwd"}, impl=impl, error=f"{type(ex).__name__}: {ex}"))
                print(f"sweep {work:34s} bwd {impl:14s} ERROR {type(ex).__name__}: {ex}", flush=True)
    return rows


def run_fwd_sweep(cases_dir, index, workloads):
    """Forward alone, per tile configuration, next to cuDNN in the same process."""
    from torch.nn.attention import sdpa_kernel, SDPBackend
    rows, timed_cudnn = [], set()
    wl = {w["id"]: w for w in workloads["workloads"]}
    for e in index.get("fwd_sweep", []):
        w = wl[e["workload"]]
        b, h, hkv, sq, skv, dqk, dv = w["b"], w["h"], w["hkv"], w["sq"], w["skv"], w["dqk"], w["dv"]
        fl = flops_fwd(w)
        torch.manual_seed(0)
        q = torch.randn(b, h, sq, dqk, device=dev, dtype=torch.bfloat16)
        k = torch.randn(b, hkv, skv, dqk, device=dev, dtype=torch.bfloat16)
        v = torch.randn(b, hkv, skv, dv, device=dev, dtype=torch.bfloat16)
        # FA2 where it has a kernel, else any backend (Dqk != Dv).
        backends = [SDPBackend.FLASH_ATTENTION] if dqk == dv else [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
        with sdpa_kernel(backends):
            ref = F.scaled_dot_product_attention(q, k, v, is_causal=w["causal"], scale=1 / math.sqrt(dqk),
                                                 enable_gqa=hkv != h)
        if e["workload"] not in timed_cudnn:
            # cuDNN's time for this workload, once, in the same process.
            timed_cudnn.add(e["workload"])
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                ms = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=w["causal"],
                                                                  scale=1 / math.sqrt(dqk), enable_gqa=hkv != h))
            rows.append(dict(workload=e["workload"], **{"pass": "fwd"}, impl="cudnn", ms=ms,
                             tflops=fl / (ms * 1e-3) / 1e12))
            print(f"sweep {e['workload']:34s} fwd {'cudnn':16s} {ms:8.4f} ms {rows[-1]['tflops']:7.1f} TF/s",
                  flush=True)
        impl = "aec " + e["config"]
        try:
            if "error" in e["kernel"]:
                raise RuntimeError(e["kernel"]["error"])
            kern = Kernel(cases_dir, e["kernel"])
            sizes = dict(B=b, H=h, Hkv=hkv, Sq=sq, Skv=skv)
            o, _ = kern(q, k, v, {}, sizes)
            torch.cuda.synchronize()
            err = rel_err(o.float(), ref.float())
            ms = bench(lambda: kern(q, k, v, {}, sizes))
            rows.append(dict(workload=e["workload"], **{"pass": "fwd"}, impl=impl, ms=ms,
                             tflops=fl / (ms * 1e-3) / 1e12, max_rel_err=err, ptxas=e["kernel"].get("ptxas")))
            print(f"sweep {e['workload']:34s} fwd {impl:16s} {ms:8.4f} ms {rows[-1]['tflops']:7.1f} TF/s err={err:.2e}",
                  flush=True)
        except Exception as ex:
            rows.append(dict(workload=e["workload"], **{"pass": "fwd"}, impl=impl, error=f"{type(ex).__name__}: {ex}"))
            print(f"sweep {e['workload']:34s} fwd {impl:16s} ERROR {type(ex).__name__}: {ex}", flush=True)
    return rows


def main():
    args = sys.argv[1:]
    # --bench-only id,id: only those workloads' benchmark rows (no checks).
    cases_dir = args[0]
    only = set(args[args.index("--only") + 1].split(",")) if "--only" in args else None
    index = json.load(open(os.path.join(cases_dir, "index.json")))
    torch.zeros(1, device=dev)  # create PyTorch's context; our modules load into it
    for flag, sweep, name in (("--fwd-sweep", run_fwd_sweep, "fwd_sweep.json"),
                              ("--bwd-sweep", run_bwd_sweep, "bwd_sweep.json")):
        if flag in args:
            workloads = json.load(open(os.path.join(cases_dir, "workloads.json")))
            rows = sweep(cases_dir, index, workloads)
            with open(os.path.join(OUT, name), "w") as fh:
                json.dump(dict(device=torch.cuda.get_device_name(), date=datetime.date.today().isoformat(),
                               compiler=index.get("compiler"), torch=torch.__version__, rows=rows), fh, indent=1)
            return
    if "--bench-only" in args:
        keep = set(args[args.index("--bench-only") + 1].split(","))
        index["bench"] = [e for e in index["bench"] if e["workload"] in keep]
        ok, checks = True, []
    else:
        ok, checks = run_cases(cases_dir, index, only)
    rows = []
    if "--no-bench" not in args:
        workloads = json.load(open(os.path.join(cases_dir, "workloads.json")))
        rows = run_bench(cases_dir, index, workloads)
    result = dict(device=torch.cuda.get_device_name(), date=datetime.date.today().isoformat(),
                  commit=os.environ.get("AEC_COMMIT", "unknown"),
                  command=os.environ.get("AEC_COMMAND", "python bench/gpu_check.py " + " ".join(args)),
                  compiler=index.get("compiler", "unknown (cases built before aec-bench recorded it)"),
                  torch=torch.__version__, checks=checks, rows=rows)
    name = "results.json" if "--no-bench" not in args else "checks.json"
    with open(os.path.join(OUT, name), "w") as fh:
        json.dump(result, fh, indent=1)
    print("all checks passed" if ok else "SOME CHECKS FAILED", flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
