"""PyTorch bindings of an aec kernel library.

`aec compile … -o DIR` copies this file, unchanged, to `DIR/python/aec_library.py`.
It reads `DIR/manifest.json` (format 4): per variant and pass a *launch plan*
(the sizes a call binds, the buffers with their dtypes and shapes, the
launches in order with their grids and arguments) and the code objects built
for each GPU architecture: cubins (CUDA) and HIP code objects (AMD).
Nothing here is specific to one variant: every call interprets the plan.

    import sys; sys.path.insert(0, "DIR/python")
    import aec_library

    lib = aec_library.load("DIR")                 # the current GPU (CUDA or ROCm PyTorch)
    o = lib.Softmax(q, k, v)                      # differentiable
    o = lib.RetnetParallel(q, k, v, gamma=gamma)  # custom inputs by name
    o, state = lib.Mamba2(q, k, v, a=a, dt=dt, output_final_state=True)
    (o * w).sum().backward()                      # recurrent too: dq, dk, dv, da, ddt
    out = lib.Softmax.run("forward", {"q": q, "k": k, "v": v})  # every output

Only the standard library and PyTorch are used, and PyTorch only once a
library is loaded: the plan interpreter (size binding, checks, grids, the
split-KV rule) is plain Python over shapes given as tuples.

A launch whose plan names a `module` (the recurrent backward's states pass)
is loaded from that module of the build (`builds[i].modules[name]`), the
others from the build's own `cubin` (or `code_object`).

With PyTorch built for CUDA, kernels are loaded from their cubins through
the CUDA driver (ctypes, `libcuda.so.1`) into PyTorch's context of the
device; with PyTorch built for ROCm, from the HIP code objects through the
HIP runtime (ctypes, `libamdhip64.so`, the one PyTorch uses) on the device.
Either way they are launched on PyTorch's current stream, so they order
with PyTorch's own work.

A launch argument `{"tensor_map": {"buffer": "q", "dims": [...], "box": [...]}}`
(the sm_90a forwards that load q, k and v with TMA copies) is a CUDA tensor
map of that input, passed by value: each call encodes it for the call's
tensor with the driver's cuTensorMapEncodeTiled (it holds the tensor's
address), so only the plan is kept between calls of the same shapes.
"""

import ctypes
import json
import os
import threading

__all__ = ["Error", "load", "Library", "Variant", "Plan", "TensorInfo"]

#: The manifest format this module reads.
FORMAT = 4

I32_MAX = 2**31 - 1
GRID_X_MAX = 2**31 - 1
GRID_YZ_MAX = 65535
#: HIP's grids: at most this many threads along each dimension.
HIP_WORK_MAX = 2**32 - 1
#: Every tensor handed to a kernel starts at a multiple of this many bytes
#: (the Hopper kernels read q, k and v with the bulk tensor copy engine).
ALIGN_BYTES = 16

DTYPES = ("bf16", "f16", "f32")
ROLES = ("input", "optional_input", "output", "optional_output", "workspace")
#: Bytes per element of each dtype.
DTYPE_BYTES = {"bf16": 2, "f16": 2, "f32": 4}

# Tensor maps (ArgPlan::TensorMap): a CUtensorMap is 128 opaque bytes at a
# 64-byte-aligned address, passed to the kernel by value and encoded for
# each call with cuTensorMapEncodeTiled, which takes extents of 1 to 2^32,
# byte strides that are multiples of 16 below 2^40 and box extents of 1 to
# 256 (with the 128-byte swizzle, a box row of at most 128 bytes).
TENSOR_MAP_BYTES = 128
TENSOR_MAP_ALIGN = 64
TENSOR_MAP_RANK = 3
TENSOR_MAP_MAX_DIM = 2**32
TENSOR_MAP_MAX_STRIDE = 2**40
TENSOR_MAP_MAX_BOX = 256
TENSOR_MAP_SWIZZLE_BYTES = 128
#: CUtensorMapDataType of each dtype.
TENSOR_MAP_DATA_TYPES = {"f16": 6, "f32": 7, "bf16": 9}
#: CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
#: CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE.
TENSOR_MAP_INTERLEAVE, TENSOR_MAP_SWIZZLE, TENSOR_MAP_L2_PROMOTION, TENSOR_MAP_OOB_FILL = 0, 3, 2, 0

# The CUDA architecture aec builds for each compute capability major
# version: 9.0 runs sm_90a cubins (Hopper-only instructions), 8.x runs sm_80.
_ARCH_OF_MAJOR = {9: "sm_90a", 8: "sm_80"}
# The `--target` names that build an architecture, for error messages.
_TARGETS_OF_ARCH = {"sm_90a": "h100 or h200", "sm_80": "a100", "gfx90a": "mi250", "gfx942": "mi300x"}


def is_hip_arch(arch):
    """Whether `arch` is an AMD one (`gfx942`), built as HIP code objects."""
    return arch.startswith("gfx")


def binary_of(build):
    """A build's code object, relative to the library: its `cubin` (CUDA) or
    `code_object` (HIP); None when it was not compiled (sources only)."""
    return build.get("cubin") if "cubin" in build else build.get("code_object")


def _is_build(build):
    return "cubin" in build or "code_object" in build


def _not_compiled(arch):
    """Why a library has `arch` sources but no code objects, and the remedy."""
    if is_hip_arch(arch):
        return (
            "it was compiled without the HIP compiler (hipcc or clang-19): sources only; compile it again "
            "where the HIP toolchain is installed (`cargo xtask toolchains` installs it)"
        )
    return (
        "it was compiled without NVRTC: sources only; compile it again with NVRTC (libnvrtc.so.13) "
        "on LD_LIBRARY_PATH"
    )


class Error(ValueError):
    """A library or a call this module refuses; the message names the
    variant, the tensor or size, what was expected and what was given."""


# --------------------------------------------------------------------------
# Size expressions (SizeExpr in compiler/src/launch_plan.rs): a number, a
# size name, {"mul": [e, ...]}, {"ceil_div": [a, b]}, {"floor_div": [a, b]} or
# {"min": [a, b]}.
# Grids may also read `sms`, the device's multiprocessor count.


def eval_size(expr, sizes):
    """The value of a size expression for the sizes `sizes` (name -> int)."""
    if isinstance(expr, bool):
        raise Error(f"malformed size expression {expr!r}")
    if isinstance(expr, int):
        if expr < 0:
            raise Error(f"malformed size expression {expr!r}: negative")
        return expr
    if isinstance(expr, str):
        if expr not in sizes:
            raise Error(f"size expression reads `{expr}`, which the call does not bind")
        return sizes[expr]
    if isinstance(expr, dict) and len(expr) == 1:
        ((op, terms),) = expr.items()
        if op == "mul" and isinstance(terms, list):
            value = 1
            for t in terms:
                value *= eval_size(t, sizes)
            return value
        if op == "ceil_div" and isinstance(terms, list) and len(terms) == 2:
            a, b = eval_size(terms[0], sizes), eval_size(terms[1], sizes)
            if b < 1:
                raise Error(f"size expression {show_size(expr)} divides by {b}")
            return -(-a // b)
        if op == "floor_div" and isinstance(terms, list) and len(terms) == 2:
            a, b = eval_size(terms[0], sizes), eval_size(terms[1], sizes)
            if b < 1:
                raise Error(f"size expression {show_size(expr)} divides by {b}")
            return a // b
        if op == "min" and isinstance(terms, list) and len(terms) == 2:
            return min(eval_size(terms[0], sizes), eval_size(terms[1], sizes))
    raise Error(f"malformed size expression {expr!r}")


def show_size(expr):
    """A size expression as the Rust side prints it: `ceil(H * Sq / 128) * 2`."""
    if isinstance(expr, dict) and len(expr) == 1:
        ((op, terms),) = expr.items()
        if op == "mul":
            return " * ".join(show_size(t) for t in terms)
        if op == "ceil_div" and len(terms) == 2:
            return f"ceil({show_size(terms[0])} / {show_size(terms[1])})"
        if op == "floor_div" and len(terms) == 2:
            return f"floor({show_size(terms[0])} / {show_size(terms[1])})"
        if op == "min" and len(terms) == 2:
            return f"min({show_size(terms[0])}, {show_size(terms[1])})"
    return str(expr)


# K/V bytes a multiprocessor needs in flight for the DRAM to run at full
# speed (KV_BYTES_IN_FLIGHT_PER_SM in compiler/src/cuda/forward/split_kv.rs).
KV_BYTES_IN_FLIGHT_PER_SM = 64 * 1024


def split_cost(blocks, key_blocks, splits, sms, per_sm=None, block_bytes_in_flight=0, block_fixed_work=0):
    """The busiest multiprocessor's time with `splits` KV splits (split_cost
    in compiler/src/cuda/forward/split_kv.rs), in key blocks × 1024: n =
    ceil(blocks·splits / SMs) blocks of ceil(key_blocks / splits) key
    blocks plus `block_fixed_work` 1024ths of one (0: 1024), slower by 1 +
    0.078·(KV_BYTES_IN_FLIGHT_PER_SM / in_flight − 1)² where the blocks
    resident at once (`per_sm` of them fit; None: all) keep less than
    KV_BYTES_IN_FLIGHT_PER_SM in flight (`block_bytes_in_flight` each; 0,
    not known: half of it). Integer arithmetic, as in Rust."""
    n = -(-blocks * splits // sms)
    per_block = -(-key_blocks // splits) * 1024 + (block_fixed_work or 1024)
    together = max(1, n if per_sm is None else min(n, per_sm))
    in_flight = together * (block_bytes_in_flight or KV_BYTES_IN_FLIGHT_PER_SM // 2)
    short = max(0, KV_BYTES_IN_FLIGHT_PER_SM * 1024 // in_flight - 1024)
    return n * per_block // 1024 * ((1 << 20) + short * short * 80 // 1024) // 1024


def kv_splits_for(kv_plan, sizes, sms, smem_per_sm=0, resident=0):
    """How many KV splits a split-KV forward launches with (KvSplitPlan::splits):
    1 without a plan or when `blocks` ≥ 2·SMs; otherwise the splits s from 1
    to min(clamp(key_blocks / 4, 1, max_splits), max(1, per_sm·SMs // blocks))
    with the least split_cost (with the plan's `block_bytes_in_flight` and
    `block_fixed_work`),
    the fewest among equals. per_sm, the blocks a
    multiprocessor holds at once: `resident` (the driver's occupancy count
    for the split launch's function, registers included) when it is above
    0, else, where the plan's `block_smem_bytes` and `smem_per_sm` (the
    device's shared memory per multiprocessor) are not 0, smem_per_sm //
    (block_smem_bytes + 1024); else unknown (no wave cap)."""
    if not kv_plan:
        return 1
    blocks = eval_size(kv_plan["blocks"], sizes)
    key_blocks = eval_size(kv_plan["key_blocks"], sizes)
    sms = max(int(sms), 1)
    if blocks >= 2 * sms or blocks == 0:
        return 1
    top = max(1, min(max(key_blocks // 4, 1), int(kv_plan["max_splits"])))
    block_smem = int(kv_plan.get("block_smem_bytes", 0))
    if resident > 0:
        per_sm = int(resident)
    elif block_smem != 0 and smem_per_sm > 0:
        per_sm = int(smem_per_sm) // (block_smem + 1024)
    else:
        per_sm = None
    if per_sm is not None:
        top = min(top, max(1, per_sm * sms // blocks))
    in_flight = int(kv_plan.get("block_bytes_in_flight", 0))
    fixed = int(kv_plan.get("block_fixed_work", 0))
    return min(range(1, top + 1),
               key=lambda s: (split_cost(blocks, key_blocks, s, sms, per_sm, in_flight, fixed), s))


# --------------------------------------------------------------------------
# Manifest and architecture choice.


def arch_for_capability(capability):
    """The architecture of the cubins a device of compute capability
    `(major, minor)` runs: (9, 0) -> sm_90a, (8, x) -> sm_80."""
    major, minor = capability
    if major == 9 and minor != 0:
        raise Error(f"compute capability {major}.{minor}: aec's sm_90a cubins run on 9.0 only")
    if major not in _ARCH_OF_MAJOR:
        known = ", ".join(f"{m}.x -> {a}" for m, a in sorted(_ARCH_OF_MAJOR.items()))
        raise Error(f"compute capability {major}.{minor}: aec builds no kernels for it (it builds {known})")
    return _ARCH_OF_MAJOR[major]


def check_manifest(manifest, where="manifest.json"):
    """Refuses a manifest this module cannot read; returns it."""
    if not isinstance(manifest, dict):
        raise Error(f"{where}: not a JSON object")
    fmt = manifest.get("format")
    if fmt != FORMAT:
        got = "no `format` field" if fmt is None else f"format {fmt!r}"
        raise Error(
            f"{where}: {got}, but this module reads format {FORMAT}; compile the library again with "
            f"the aec that wrote this module (or use the aec_library.py in the library's python/ folder)"
        )
    variants = manifest.get("variants")
    if not isinstance(variants, list):
        raise Error(f"{where}: no `variants` list")
    for v in variants:
        for key in ("name", "pattern", "inputs", "kernels"):
            if key not in v:
                raise Error(f"{where}: variant {v.get('name', '?')!r} has no `{key}`")
        if v["pattern"] not in ("parallel", "recurrent"):
            raise Error(f"{where}: variant {v['name']}: unknown pattern {v['pattern']!r}")
        for i, k in enumerate(v["kernels"]):
            for j, t in enumerate(k.get("tuned_for") or ()):
                at = f"{where}: variant {v['name']}: kernels[{i}].tuned_for[{j}]"
                if not isinstance(t, dict):
                    raise Error(f"{at}: not an object")
                sizes = t.get("sizes")
                if "gpu" in t and "device" in t:
                    raise Error(f"{at}: has both `gpu` (a driver name) and `device` (a product)")
                if "device" in t:
                    sms = t.get("sms")
                    if not isinstance(t["device"], str) or not isinstance(sms, int) or not 1 <= sms <= 65535:
                        raise Error(f"{at}: `device` needs a product name and `sms` its multiprocessors (1 to 65535)")
                elif not isinstance(t.get("gpu"), str):
                    raise Error(f"{at}: no `gpu` name (or `device` and `sms`)")
                if not isinstance(sizes, dict) or not all(isinstance(x, int) for x in sizes.values()):
                    raise Error(f"{at}: `sizes` is not an object of integers")
    return manifest


def read_manifest(directory):
    """`directory/manifest.json`, checked."""
    path = os.path.join(directory, "manifest.json")
    try:
        with open(path) as fh:
            text = fh.read()
    except OSError as e:
        raise Error(f"{path}: {e.strerror or e}; is {directory!r} a library written by `aec compile`?") from None
    try:
        manifest = json.loads(text)
    except ValueError as e:
        raise Error(f"{path}: not valid JSON: {e}") from None
    return check_manifest(manifest, path)


def built_archs(manifest):
    """The architectures the library holds code objects for (cubins or HIP
    code objects), sorted."""
    archs = set()
    for v in manifest["variants"]:
        for k in v["kernels"]:
            for b in k.get("builds") or []:
                if _is_build(b) and binary_of(b):
                    archs.add(b["arch"])
    return sorted(archs)


def all_archs(manifest):
    """Every architecture the library has builds for (cubins or not, CUDA and HIP)."""
    return sorted({b["arch"] for v in manifest["variants"] for k in v["kernels"] for b in k.get("builds") or []})


def check_arch(manifest, arch, capability=None):
    """Refuses a library without a single code object for `arch`."""
    if arch in built_archs(manifest):
        return
    cap = f" (compute capability {capability[0]}.{capability[1]})" if capability else ""
    have = all_archs(manifest)
    if arch in have:
        what = "HIP code objects" if is_hip_arch(arch) else "cubins"
        raise Error(f"this library has {arch} kernels but no {what} ({_not_compiled(arch)})")
    target = _TARGETS_OF_ARCH.get(arch)
    hint = f"; compile it again with `--target {target}`" if target else ""
    raise Error(
        f"this library has no kernels for {arch}, the device's architecture{cap}; "
        f"it has: {', '.join(have) or 'none'}{hint}"
    )


def select_kernel(variant, pass_name, arch):
    """The kernel record of `variant` (a manifest entry) for `pass_name` on
    `arch` and the path of its code object (relative to the library), or an
    Error that says why there is none."""
    record, build = select_build(variant, pass_name, arch)
    return record, binary_of(build)


def build_modules(variant, record, build):
    """The cubins (relative to the library) of the modules the launches of
    `record`'s plan name (`{"states": path}`), or an Error naming a missing one."""
    modules = build.get("modules") or {}
    out = {}
    for launch in record["plan"]["launches"]:
        key = launch.get("module")
        if key is None:
            continue
        path = modules.get(key)
        if not path:
            why = "is not listed" if key not in modules else "has no cubin (compiled without NVRTC?)"
            raise Error(
                f"{variant['name']} {record['pass']}: launch {launch['entry']} is in the module `{key}`, "
                f"which the {build.get('arch')} build {why}"
            )
        out[key] = path
    return out


def select_build(variant, pass_name, arch):
    """The kernel record of `variant` for `pass_name` on `arch` and its build
    (with its cubin), or an Error that says why there is none."""
    name = variant["name"]
    records = [k for k in variant["kernels"] if k.get("pass") == pass_name and "plan" in k]
    for k in records:
        if k.get("tuned_for"):
            continue  # the tuning table's kernels: see select_tuned
        for b in k.get("builds") or []:
            if b.get("arch") == arch and _is_build(b):
                if not binary_of(b):
                    what = "HIP code object" if is_hip_arch(arch) else "cubin"
                    raise Error(f"{name} {pass_name}: the library has no {arch} {what} ({_not_compiled(arch)})")
                build_modules(variant, k, b)
                return k, b
    if pass_name == "backward":
        reason = backward_unavailable(variant, arch)
        raise Error(f"{name} backward: {reason}")
    have = sorted({b["arch"] for k in records for b in k.get("builds") or []})
    skipped = [k["skipped"] for k in variant["kernels"] if k.get("pass") == pass_name and "skipped" in k]
    why = f" ({'; '.join(skipped)})" if skipped else ""
    raise Error(
        f"{name} {pass_name}: no kernel for {arch} in this library; it has {pass_name} kernels for: "
        f"{', '.join(have) or 'none'}{why}"
    )


def bucket_len(n):
    """A sequence length's tuning bucket: the next power of two (450 -> 512),
    at most 2^31, as `aec tune` keys its results."""
    return min(1 << max(int(n) - 1, 0).bit_length(), 1 << 31)


def in_bucket(tuned, sizes):
    """Whether a call of `sizes` (name -> value) falls in the bucket of a
    `tuned_for` item: its sizes equal, the `bucketed` ones after bucket_len."""
    bucketed = set(tuned.get("bucketed") or ())
    for name, want in tuned["sizes"].items():
        if name not in sizes:
            return False
        got = bucket_len(sizes[name]) if name in bucketed else sizes[name]
        if got != want:
            return False
    return True


def is_for_gpu(tuned, gpu, sms):
    """Whether a `tuned_for` item is for the GPU of driver name `gpu` with
    `sms` multiprocessors: `gpu` names it exactly (what `aec tune` measured
    on), or its name contains the item's `device` ignoring case and it has
    the item's `sms` (the untuned choice `aec compile` made for a declared
    workload on that product)."""
    if "device" in tuned:
        return tuned.get("sms") == sms and tuned["device"].lower() in gpu.lower()
    return tuned.get("gpu") == gpu


def select_tuned(variant, pass_name, arch, gpu, sizes, sms):
    """The tuning table's kernel record of `variant` for `pass_name` on
    `arch` chosen for the GPU named `gpu` (with `sms` multiprocessors) and
    the bucket of `sizes`, with its build and the matching `tuned_for` item;
    None when the table has none (the default record then runs)."""
    for k in variant["kernels"]:
        if k.get("pass") != pass_name or "plan" not in k or not k.get("tuned_for"):
            continue
        build = next((b for b in k.get("builds") or [] if b.get("arch") == arch and _is_build(b) and binary_of(b)), None)
        if build is None:
            continue
        for t in k["tuned_for"]:
            if is_for_gpu(t, gpu, sms) and in_bucket(t, sizes):
                return k, build, t
    return None


def backward_unavailable(variant, arch):
    """Why `variant` has no backward on `arch` (None when it has one)."""
    if "backward" in variant and variant["backward"] is None:
        return "no backward kernels: " + variant.get("backward_note", "the library records none")
    records = [k for k in variant["kernels"] if k.get("pass") == "backward"]
    for k in records:
        for b in k.get("builds") or []:
            if b.get("arch") == arch and _is_build(b):
                if binary_of(b):
                    return None
                if is_hip_arch(arch):
                    return f"the {arch} backward was compiled without the HIP compiler (no code object)"
                return f"the {arch} backward was compiled without NVRTC (no cubin)"
    # Skipped CUDA backwards carry no target; skipped HIP ones name theirs.
    skipped = [k["skipped"] for k in records if "skipped" in k and "target" not in k]
    if skipped:
        return "no backward kernels: " + "; ".join(skipped)
    have = sorted({b["arch"] for k in records for b in k.get("builds") or []})
    return f"no backward kernel for {arch} in this library (it has: {', '.join(have) or 'none'})"


# --------------------------------------------------------------------------
# The plan interpreter, over plain shapes.


class TensorInfo:
    """What the checks need of a tensor: its shape (a tuple), dtype (`bf16`,
    `f16`, `f32`, or any other text for other types), device (`cuda:N` or
    another text), whether it is contiguous and 16-byte aligned."""

    __slots__ = ("shape", "dtype", "device", "contiguous", "aligned")

    def __init__(self, shape, dtype, device="cuda:0", contiguous=True, aligned=True):
        self.shape = tuple(int(d) for d in shape)
        self.dtype, self.device = dtype, device
        self.contiguous, self.aligned = contiguous, aligned


class Call:
    """A checked call of a plan: the bound sizes, the number of KV splits,
    the buffers to allocate and the launches to make, in order."""

    def __init__(self, sizes, kv_splits, allocations, launches, outputs, modules=None):
        #: name -> int, the plan's sizes and `kv_splits`.
        self.sizes = sizes
        self.kv_splits = kv_splits
        #: [(name, dtype, shape tuple, zeroed)] the loader allocates.
        self.allocations = allocations
        #: [(entry, (x, y, z), threads, dynamic_smem_bytes, args)], args
        #: [("ptr", buffer name or None for a null pointer) | ("i32", int)
        #: | ("tensor_map", TensorMapArg)].
        self.launches = launches
        #: The names the call returns (outputs, wanted optional outputs).
        self.outputs = outputs
        #: Per launch: the module that holds its entry (a key of the build's
        #: `modules`), or None for the build's own cubin.
        self.modules = modules if modules is not None else [None] * len(launches)


class TensorMapArg:
    """A tensor-map argument of a checked call (ArgPlan::TensorMap): what
    cuTensorMapEncodeTiled takes for the call's sizes, all but the address,
    which each launch gives (a map holds its tensor's address)."""

    __slots__ = ("buffer", "dtype", "dims", "strides", "box")

    def __init__(self, buffer, dtype, dims, box):
        #: The input it maps, its dtype (`bf16`, `f16`).
        self.buffer, self.dtype = buffer, dtype
        #: Extents in elements, innermost first, and the box.
        self.dims, self.box = tuple(dims), tuple(box)
        #: Byte strides of the outer two dimensions (the tensor is contiguous).
        b = DTYPE_BYTES[dtype]
        self.strides = (self.dims[0] * b, self.dims[0] * self.dims[1] * b)

    @property
    def data_type(self):
        """The CUtensorMapDataType (bf16: 9, f16: 6, f32: 7)."""
        return TENSOR_MAP_DATA_TYPES[self.dtype]

    def encode_args(self, address):
        """cuTensorMapEncodeTiled's arguments after the output map, as plain
        values: (data_type, rank, address, dims, strides, box,
        element_strides, interleave, swizzle, l2_promotion, oob_fill)."""
        return (
            self.data_type,
            TENSOR_MAP_RANK,
            int(address),
            self.dims,
            self.strides,
            self.box,
            (1,) * TENSOR_MAP_RANK,
            TENSOR_MAP_INTERLEAVE,
            TENSOR_MAP_SWIZZLE,
            TENSOR_MAP_L2_PROMOTION,
            TENSOR_MAP_OOB_FILL,
        )

    def describe(self):
        return f"the tensor map of `{self.buffer}` ({self.dtype}, dims {_dims(self.dims)}, box {_dims(self.box)})"

    def __eq__(self, other):
        return isinstance(other, TensorMapArg) and all(getattr(self, n) == getattr(other, n) for n in self.__slots__)

    def __hash__(self):
        return hash((self.buffer, self.dims, self.box))

    def __repr__(self):
        return f"TensorMapArg({self.buffer!r}, {self.dtype!r}, dims={self.dims}, box={self.box})"


def encode_tensor_map(driver, out_address, arg, address, where="aec"):
    """Encodes `arg` (a TensorMapArg) for the tensor at device address
    `address` into the 128 bytes at host address `out_address` (64-byte
    aligned) through `driver.encode_tensor_map` (the driver's
    cuTensorMapEncodeTiled: its arguments, a CUresult back); an Error names
    the tensor, its dims and box when the address is not 16-byte aligned or
    the driver refuses."""
    address = int(address)
    if address % ALIGN_BYTES:
        raise Error(
            f"{where}: {arg.buffer}: its data at {address:#x} does not start at a multiple of {ALIGN_BYTES} bytes, "
            f"which cuTensorMapEncodeTiled needs for {arg.describe()}; pass {arg.buffer}.clone()"
        )
    if out_address % TENSOR_MAP_ALIGN:
        raise Error(f"{where}: {arg.describe()}: the map's host memory at {out_address:#x} is not {TENSOR_MAP_ALIGN}-byte aligned")
    res = driver.encode_tensor_map(out_address, *arg.encode_args(address))
    if res:
        name = driver.error_name(res) if hasattr(driver, "error_name") else f"error {res}"
        raise Error(
            f"{where}: cuTensorMapEncodeTiled failed ({name}) for {arg.describe()} at {address:#x}, "
            f"byte strides {_dims(arg.strides)}"
        )


def _eval_or(expr, sizes, default):
    try:
        return eval_size(expr, sizes)
    except Error:
        return default


def _dims(values):
    return "[" + ", ".join(str(v) for v in values) + "]"


class Plan:
    """One entry point (forward or backward) of one variant on one
    architecture: a launch plan of the manifest, interpreted."""

    def __init__(self, variant, plan):
        self.variant = variant
        self.plan = plan
        self.pass_name = plan.get("pass", "?")
        self.where = f"{variant} {self.pass_name}"
        self.buffers = {}
        for b in plan["buffers"]:
            if b["role"] not in ROLES:
                raise Error(f"{self.where}: buffer `{b['name']}` has unknown role {b['role']!r}")
            if b["dtype"] not in DTYPES:
                raise Error(f"{self.where}: buffer `{b['name']}` has unknown dtype {b['dtype']!r}")
            self.buffers[b["name"]] = b
        self.size_names = [s["name"] for s in plan["sizes"]]
        self.fixed = {s["name"]: s["fixed"] for s in plan["sizes"] if s.get("fixed") is not None}
        self.multiple_of = [tuple(p) for p in plan.get("multiple_of", [])]
        self.equal = [tuple(p) for p in plan.get("equal", [])]
        self.kv_plan = plan.get("kv_splits")
        self.launch_plans = plan["launches"]
        #: How messages call a buffer where the caller knows it by another
        #: name (a recurrent variant's `initial_state` is `state_in`).
        self.labels = {}
        for launch in self.launch_plans:
            for a in launch["args"]:
                if isinstance(a, dict) and "tensor_map" in a:
                    self.check_tensor_map(launch, a["tensor_map"])

    def check_tensor_map(self, launch, m):
        """Refuses a tensor-map argument of `launch` that does not map a
        16-bit input, whose dims are not three expressions of the plan's
        sizes, or whose box is not three integers from 1 to 256 (its row at
        most 128 bytes, the swizzle's span)."""
        at = f"{self.where}: launch {launch.get('entry', '?')}"
        if not isinstance(m, dict) or not {"buffer", "dims", "box"} <= set(m):
            raise Error(f"{at}: malformed tensor_map argument {m!r} (expected buffer, dims and box)")
        name = m["buffer"]
        b = self.buffers.get(name) if isinstance(name, str) else None
        if b is None:
            raise Error(f"{at} maps unknown buffer `{name}`")
        if b["role"] != "input" or DTYPE_BYTES[b["dtype"]] != 2:
            raise Error(f"{at} maps `{name}`, which is not a 16-bit input (it is a{'n' if b['role'][0] in 'aeiou' else ''} {b['role']} of {b['dtype']})")
        what = f"{at}: tensor map of `{name}`"
        dims = m["dims"]
        if not isinstance(dims, list) or len(dims) != TENSOR_MAP_RANK:
            raise Error(f"{what}: dims {dims!r}: expected {TENSOR_MAP_RANK} size expressions")
        ones = {n: 1 for n in self.size_names}
        for i, e in enumerate(dims):
            try:
                eval_size(e, ones)
            except Error as err:
                raise Error(f"{what}: dims[{i}]: {err}") from None
        box = m["box"]
        if (
            not isinstance(box, list)
            or len(box) != TENSOR_MAP_RANK
            or not all(isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= TENSOR_MAP_MAX_BOX for x in box)
        ):
            raise Error(f"{what}: box {box!r}: expected {TENSOR_MAP_RANK} integers from 1 to {TENSOR_MAP_MAX_BOX}")
        row = box[0] * DTYPE_BYTES[b["dtype"]]
        if row > TENSOR_MAP_SWIZZLE_BYTES:
            raise Error(
                f"{what}: box {_dims(box)}: a row of {box[0]} {b['dtype']} elements is {row} bytes, "
                f"wider than the {TENSOR_MAP_SWIZZLE_BYTES}-byte swizzle"
            )

    def tensor_map(self, launch, m, sizes, infos, hip=False):
        """The TensorMapArg of a tensor-map argument (checked by
        check_tensor_map) for the bound `sizes`: an Error naming the tensor
        where an extent is outside 1 to 2^32, the extents cover more than
        the tensor, or a stride is beyond the encoder's limits."""
        name = m["buffer"]
        at = f"{self.where}: launch {launch['entry']}"
        if hip:
            raise Error(
                f"{at} takes a CUDA tensor map of `{name}`, which HIP cannot launch "
                f"(HIP libraries have no tensor-map arguments: is this plan from a CUDA build?)"
            )
        b = self.buffers[name]
        dims = tuple(eval_size(e, sizes) for e in m["dims"])
        shown = _dims(show_size(e) for e in m["dims"])
        label = self.label(name)
        bound = ", ".join(f"{n}={sizes[n]}" for n in self.size_names if n in sizes)
        for d in dims:
            if not 1 <= d <= TENSOR_MAP_MAX_DIM:
                raise Error(
                    f"{at}: {label}: tensor map dims {shown} = {_dims(dims)}: {d} is outside 1 to 2^32 "
                    f"(cuTensorMapEncodeTiled's limit) for {bound}"
                )
        shape = infos[name].shape if name in infos else tuple(eval_size(e, sizes) for e in b["shape"])
        elements = 1
        for d in shape:
            elements *= d
        covered = dims[0] * dims[1] * dims[2]
        if covered > elements:
            raise Error(
                f"{at}: {label}: tensor map dims {shown} = {_dims(dims)} cover {covered} elements, "
                f"more than the tensor's {elements} ({_dims(shape)})"
            )
        arg = TensorMapArg(name, b["dtype"], dims, m["box"])
        for s in arg.strides:
            if s % ALIGN_BYTES or s >= TENSOR_MAP_MAX_STRIDE:
                raise Error(
                    f"{at}: {label}: tensor map dims {shown} = {_dims(dims)} give byte strides {_dims(arg.strides)}; "
                    f"cuTensorMapEncodeTiled needs multiples of {ALIGN_BYTES} below 2^40"
                )
        return arg

    def label(self, name):
        other = self.labels.get(name)
        return f"{other} ({name})" if other else name

    # The buffers by role.
    def names(self, *roles):
        return [b["name"] for b in self.plan["buffers"] if b["role"] in roles]

    @property
    def inputs(self):
        return self.names("input")

    @property
    def optional_inputs(self):
        return self.names("optional_input")

    @property
    def outputs(self):
        return self.names("output")

    @property
    def optional_outputs(self):
        return self.names("optional_output")

    def shape_text(self, name):
        return _dims(show_size(e) for e in self.buffers[name]["shape"])

    def check_names(self, given, want=()):
        """Refuses unknown and missing inputs and unknown wanted outputs."""
        accepted = self.inputs + self.optional_inputs
        for n in given:
            if n not in accepted:
                takes = ", ".join(self.inputs + [f"{o} (optional)" for o in self.optional_inputs])
                raise Error(f"{self.where}: unknown input `{n}`; it takes {takes}")
        missing = [n for n in self.inputs if n not in given]
        if missing:
            raise Error(
                f"{self.where}: missing input{'s' if len(missing) > 1 else ''} "
                + ", ".join(f"`{n}` {self.shape_text(n)} {self.buffers[n]['dtype']}" for n in missing)
            )
        for n in want:
            if n not in self.optional_outputs:
                opts = ", ".join(self.optional_outputs) or "none"
                raise Error(f"{self.where}: unknown optional output `{n}` (it has: {opts})")

    def check_tensor(self, name, info, device):
        """Refuses a tensor on the wrong device, of the wrong dtype, not
        contiguous or not aligned (the shape is checked once sizes are bound)."""
        b, label = self.buffers[name], self.label(name)
        if not str(info.device).startswith("cuda"):
            raise Error(f"{self.where}: {label}: a {info.device} tensor; the kernels need it on {device}")
        if device is not None and str(info.device) != str(device):
            raise Error(f"{self.where}: {label}: on {info.device}, but the library was loaded for {device}")
        if info.dtype != b["dtype"]:
            raise Error(
                f"{self.where}: {label}: expected dtype {b['dtype']} ({_TORCH_DTYPE_NAMES[b['dtype']]}), got {info.dtype}"
            )
        if not info.contiguous:
            raise Error(
                f"{self.where}: {label}: not contiguous (the kernels read it row-major in "
                f"{self.shape_text(name)}); pass {self.labels.get(name, name)}.contiguous()"
            )
        if not info.aligned:
            raise Error(
                f"{self.where}: {label}: its data does not start at a multiple of {ALIGN_BYTES} bytes "
                f"(a view at an offset?); pass {self.labels.get(name, name)}.clone()"
            )

    def bind(self, shapes):
        """The sizes the shapes `shapes` (name -> tuple) give: each size at
        its first sight in plan order, then sizes fixed by the variant and
        sizes equal to a bound one; every shape is then checked against them.
        Returns (sizes, origin) with origin[size] = "q's dim 2" or similar."""
        sizes, origin = {}, {}
        given = [b for b in self.plan["buffers"] if b["name"] in shapes]
        for b in given:
            shape = shapes[b["name"]]
            if len(shape) != len(b["shape"]):
                continue  # reported below, with the sizes the others give
            for i, (e, d) in enumerate(zip(b["shape"], shape)):
                if isinstance(e, str) and e not in sizes:
                    sizes[e], origin[e] = d, f"{b['name']}'s dim {i}"
        for name, value in self.fixed.items():
            if name not in sizes:
                sizes[name], origin[name] = value, f"fixed by {self.variant}"
        for a, b in self.equal:
            if a not in sizes and b in sizes:
                sizes[a], origin[a] = sizes[b], f"equal to {b}"
            elif b not in sizes and a in sizes:
                sizes[b], origin[b] = sizes[a], f"equal to {a}"
        for b in given:
            name, shape = b["name"], shapes[b["name"]]
            want = [_eval_or(e, sizes, "?") for e in b["shape"]]
            if list(shape) != want:
                raise Error(f"{self.where}: {self.label(name)}: expected {self.shape_text(name)} = {_dims(want)}, got {_dims(shape)}")
        return sizes, origin

    def check_sizes(self, sizes, origin):
        """Refuses sizes below 1, beyond 32 bits, unlike the variant's fixed
        ones, or breaking the plan's multiple_of / equal pairs."""

        def said(n):
            return f"{n} = {sizes[n]} (from {origin.get(n, 'the call')})"

        for n in self.size_names:
            if n not in sizes:
                raise Error(f"{self.where}: no input's shape gives the size {n}")
        for n in self.size_names:
            v = sizes[n]
            if v < 1:
                raise Error(f"{self.where}: {said(n)}: every size must be at least 1")
            if v > I32_MAX:
                raise Error(f"{self.where}: {said(n)}: every size must fit a 32-bit int (at most {I32_MAX})")
        for n, value in self.fixed.items():
            if sizes[n] != value:
                raise Error(f"{self.where}: {said(n)}, but {self.variant} fixes {n} = {value}")
        for a, b in self.multiple_of:
            if sizes[a] % sizes[b] != 0:
                raise Error(f"{self.where}: {said(a)} must be a multiple of {said(b)}")
        for a, b in self.equal:
            if sizes[a] != sizes[b]:
                raise Error(f"{self.where}: {said(a)} must equal {said(b)}")

    def kv_splits(self, sizes, sms, override=None, smem_per_sm=0, resident=0):
        """The number of KV splits: the plan's rule (with the device's shared
        memory per multiprocessor and the split launch's resident blocks per
        multiprocessor, each 0 if unknown), or `override` (1 ≤ n ≤ max_splits)."""
        if override is None:
            return kv_splits_for(self.kv_plan, sizes, sms, smem_per_sm, resident)
        if not self.kv_plan:
            if override != 1:
                raise Error(f"{self.where}: kv_splits={override}, but this plan has no split-KV launch (only 1)")
            return 1
        top = int(self.kv_plan["max_splits"])
        if not isinstance(override, int) or not 1 <= override <= top:
            raise Error(f"{self.where}: kv_splits={override!r}: expected an int from 1 to {top}")
        return override

    def split_launch(self):
        """The launch whose grid reads `kv_splits` (a dict of the plan), or None."""
        def reads(expr):
            if isinstance(expr, str):
                return expr == "kv_splits"
            if isinstance(expr, dict):
                return any(reads(t) for terms in expr.values() for t in terms)
            return False
        if not self.kv_plan:
            return None
        return next((l for l in self.plan["launches"] if any(reads(g) for g in l["grid"])), None)

    def prepare(self, infos, want=(), sms=1, kv_splits=None, device=None, hip=False, smem_per_sm=0, resident=0):
        """Checks a call with the tensors `infos` (name -> TensorInfo) and
        plans it: a Call, or an Error naming what is wrong. `hip`: the launch
        goes through HIP, whose grids also have at most 2^32 - 1 threads
        along each dimension."""
        self.check_names(infos, want)
        for b in self.plan["buffers"]:
            if b["name"] in infos:
                self.check_tensor(b["name"], infos[b["name"]], device)
        sizes, origin = self.bind({n: i.shape for n, i in infos.items()})
        self.check_sizes(sizes, origin)
        sizes = {n: sizes[n] for n in self.size_names}
        splits = self.kv_splits(sizes, sms, kv_splits, smem_per_sm, resident)
        sizes["kv_splits"] = splits
        # Grids may also read the multiprocessor count (persistent kernels).
        grid_sizes = dict(sizes, sms=max(int(sms), 1))
        present = set(infos)
        allocations = []
        for b in self.plan["buffers"]:
            role = b["role"]
            if role in ("input", "optional_input"):
                continue
            if role == "optional_output" and b["name"] not in want:
                continue
            if b.get("when") == "split_kv" and splits <= 1:
                continue
            shape = tuple(eval_size(e, sizes) for e in b["shape"])
            allocations.append((b["name"], b["dtype"], shape, bool(b.get("zeroed"))))
            present.add(b["name"])
        launches, modules = [], []
        for launch in self.launch_plans:
            if launch.get("when") == "split_kv" and splits <= 1:
                continue
            grid = tuple(eval_size(e, grid_sizes) for e in launch["grid"])
            if not (1 <= grid[0] <= GRID_X_MAX and 1 <= grid[1] <= GRID_YZ_MAX and 1 <= grid[2] <= GRID_YZ_MAX):
                bound = ", ".join(f"{n}={sizes[n]}" for n in self.size_names)
                raise Error(
                    f"{self.where}: launch {launch['entry']}: grid {_dims(grid)} = "
                    f"{_dims(show_size(e) for e in launch['grid'])} is beyond CUDA's limits "
                    f"(x < 2^31, y and z < 65536) for {bound}"
                )
            if hip and max(grid) * launch["threads"] > HIP_WORK_MAX:
                bound = ", ".join(f"{n}={sizes[n]}" for n in self.size_names)
                raise Error(
                    f"{self.where}: launch {launch['entry']}: grid {_dims(grid)} of {launch['threads']}-thread blocks "
                    f"is beyond HIP's limit (at most 2^32 - 1 threads along each dimension) for {bound}"
                )
            args = []
            for a in launch["args"]:
                if "ptr" in a:
                    if a["ptr"] not in self.buffers:
                        raise Error(f"{self.where}: launch {launch['entry']} reads unknown buffer `{a['ptr']}`")
                    args.append(("ptr", a["ptr"] if a["ptr"] in present else None))
                elif "null" in a:
                    args.append(("ptr", None))
                elif "tensor_map" in a:
                    args.append(("tensor_map", self.tensor_map(launch, a["tensor_map"], sizes, infos, hip)))
                elif "i32" in a:
                    value = eval_size(a["i32"], sizes)
                    if value > I32_MAX:
                        raise Error(f"{self.where}: argument {show_size(a['i32'])} = {value} does not fit a 32-bit int")
                    args.append(("i32", value))
                else:
                    raise Error(f"{self.where}: launch {launch['entry']}: unknown argument {a!r}")
            launches.append((launch["entry"], grid, int(launch["threads"]), int(launch["dynamic_smem_bytes"]), args))
            modules.append(launch.get("module"))
        outputs = self.outputs + [n for n in self.optional_outputs if n in want]
        return Call(sizes, splits, allocations, launches, outputs, modules)


_TORCH_DTYPE_NAMES = {"bf16": "torch.bfloat16", "f16": "torch.float16", "f32": "torch.float32"}


# --------------------------------------------------------------------------
# The GPU drivers, through ctypes: the CUDA driver and the HIP runtime, with
# the same few calls.


class _Driver:
    """The few driver calls the loader makes (libcuda.so.1)."""

    NAME = "CUDA"
    LAUNCH = "cuLaunchKernel"
    CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8

    def __init__(self):
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise Error(f"the CUDA driver (libcuda.so.1) cannot be loaded: {e}") from None
        p, vp, i = ctypes.POINTER, ctypes.c_void_p, ctypes.c_int
        lib.cuInit.argtypes = [ctypes.c_uint]
        lib.cuDeviceGet.argtypes = [p(i), i]
        lib.cuDevicePrimaryCtxRetain.argtypes = [p(vp), i]
        lib.cuCtxGetCurrent.argtypes = [p(vp)]
        lib.cuCtxPushCurrent_v2.argtypes = [vp]
        lib.cuCtxPopCurrent_v2.argtypes = [p(vp)]
        lib.cuModuleLoadData.argtypes = [p(vp), ctypes.c_char_p]
        lib.cuModuleGetFunction.argtypes = [p(vp), vp, ctypes.c_char_p]
        lib.cuFuncSetAttribute.argtypes = [vp, i, i]
        lib.cuOccupancyMaxActiveBlocksPerMultiprocessor.argtypes = [p(i), vp, i, ctypes.c_size_t]
        lib.cuLaunchKernel.argtypes = [vp] + [ctypes.c_uint] * 7 + [vp, vp, vp]
        lib.cuGetErrorName.argtypes = [i, p(ctypes.c_char_p)]
        self.lib = lib
        self.check(lib.cuInit(0), "cuInit")

    def check(self, res, what):
        if res != 0:
            raise RuntimeError(f"{what}: {self.error_name(res)}")

    def primary_context(self, ordinal):
        dev, ctx = ctypes.c_int(), ctypes.c_void_p()
        self.check(self.lib.cuDeviceGet(ctypes.byref(dev), ordinal), "cuDeviceGet")
        self.check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
        return ctx

    def current(self, ctx):
        """A context manager that runs its body in `ctx` (primary_context's)."""
        return _Current(self, ctx)

    def load_module(self, data, path):
        module = ctypes.c_void_p()
        self.check(self.lib.cuModuleLoadData(ctypes.byref(module), data), f"cuModuleLoadData {path}")
        return module

    def get_function(self, module, entry, smem):
        fn = ctypes.c_void_p()
        self.check(self.lib.cuModuleGetFunction(ctypes.byref(fn), module, entry.encode()), f"cuModuleGetFunction {entry}")
        if smem > 0:
            self.check(
                self.lib.cuFuncSetAttribute(fn, self.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem),
                f"cuFuncSetAttribute {entry} (MAX_DYNAMIC_SHARED_SIZE_BYTES = {smem})",
            )
        return fn

    def resident_blocks(self, fn, threads, smem):
        """Blocks of `fn` (`threads` threads, `smem` bytes of dynamic shared
        memory) one multiprocessor holds at once, by the driver's occupancy
        calculator (registers included); 0 where it cannot say."""
        n = ctypes.c_int(0)
        if self.lib.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(n), fn, threads, smem) != 0:
            return 0
        return n.value

    def launch(self, fn, grid, threads, smem, stream, params):
        """cuLaunchKernel's result (0: launched)."""
        return self.lib.cuLaunchKernel(fn, grid[0], grid[1], grid[2], threads, 1, 1, smem, stream, params, None)

    def error_name(self, res):
        """A CUresult's name (`CUDA_ERROR_INVALID_VALUE`)."""
        name = ctypes.c_char_p()
        self.lib.cuGetErrorName(res, ctypes.byref(name))
        return name.value.decode() if name.value else f"CUDA error {res}"

    def _tensor_map_encoder(self):
        """cuTensorMapEncodeTiled, resolved at its first use (CUDA 12.0 drivers
        and newer have it): an Error where the driver lacks it."""
        fn = getattr(self, "_encode_tiled", None)
        if fn is None:
            try:
                fn = self.lib.cuTensorMapEncodeTiled
            except AttributeError:
                raise Error(
                    "the CUDA driver (libcuda.so.1) has no cuTensorMapEncodeTiled, which the sm_90a kernels' "
                    "tensor maps need: update the NVIDIA driver (CUDA 12.0 or newer)"
                ) from None
            p, vp, i, u32, u64 = ctypes.POINTER, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_uint64
            fn.restype = i
            fn.argtypes = [vp, i, u32, vp, p(u64), p(u64), p(u32), p(u32), i, i, i, i]
            self._encode_tiled = fn
        return fn

    def encode_tensor_map(self, out, data_type, rank, address, dims, strides, box, element_strides,
                          interleave, swizzle, l2_promotion, oob_fill):
        """cuTensorMapEncodeTiled into the CUtensorMap at host address `out`
        (64-byte aligned); its CUresult (0: encoded)."""
        fn = self._tensor_map_encoder()
        u32, u64 = ctypes.c_uint32, ctypes.c_uint64
        return fn(
            ctypes.c_void_p(out), data_type, rank, ctypes.c_void_p(address),
            (u64 * rank)(*dims), (u64 * (rank - 1))(*strides), (u32 * rank)(*box), (u32 * rank)(*element_strides),
            interleave, swizzle, l2_promotion, oob_fill,
        )


class _Current:
    """Makes `ctx` the calling thread's current context for a while (the
    autograd engine runs backwards on threads of its own)."""

    def __init__(self, driver, ctx):
        self.driver, self.ctx, self.pushed = driver, ctx, False

    def __enter__(self):
        cur = ctypes.c_void_p()
        self.driver.check(self.driver.lib.cuCtxGetCurrent(ctypes.byref(cur)), "cuCtxGetCurrent")
        if cur.value != self.ctx.value:
            self.driver.check(self.driver.lib.cuCtxPushCurrent_v2(self.ctx), "cuCtxPushCurrent")
            self.pushed = True

    def __exit__(self, *exc):
        if self.pushed:
            old = ctypes.c_void_p()
            self.driver.check(self.driver.lib.cuCtxPopCurrent_v2(ctypes.byref(old)), "cuCtxPopCurrent")
            self.pushed = False


def _loaded_hip_runtime():
    """The path of the libamdhip64 this process has loaded (ROCm PyTorch's),
    or None: the kernels must go through the runtime PyTorch uses."""
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                path = line.split()[-1] if line.strip() else ""
                if os.path.basename(path).startswith("libamdhip64.so"):
                    return path
    except OSError:
        pass
    return None


class _HipDriver:
    """The same calls through the HIP runtime (libamdhip64.so), for PyTorch
    built for ROCm. HIP has no contexts to manage: calls run on the current
    device, which `current` sets for a while."""

    NAME = "HIP"
    LAUNCH = "hipModuleLaunchKernel"
    #: LDS a workgroup may use without asking (the HIP kernels' plans use
    #: static LDS and ask for no dynamic shared memory).
    LDS_BYTES = 65536

    def __init__(self, path=None):
        names = [path] if path else [n for n in (_loaded_hip_runtime(),) if n] + [
            "libamdhip64.so",
            "libamdhip64.so.7",
            "libamdhip64.so.6",
            "libamdhip64.so.5",
        ]
        lib, errors = None, []
        for name in names:
            try:
                lib = ctypes.CDLL(name)
                break
            except OSError as e:
                errors.append(str(e))
        if lib is None:
            raise Error(f"the HIP runtime (libamdhip64.so) cannot be loaded: {'; '.join(errors)}")
        p, vp, i, u = ctypes.POINTER, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint
        lib.hipInit.argtypes = [u]
        lib.hipGetErrorName.argtypes = [i]
        lib.hipGetErrorName.restype = ctypes.c_char_p
        lib.hipGetDevice.argtypes = [p(i)]
        lib.hipSetDevice.argtypes = [i]
        lib.hipModuleLoadData.argtypes = [p(vp), ctypes.c_char_p]
        lib.hipModuleGetFunction.argtypes = [p(vp), vp, ctypes.c_char_p]
        lib.hipModuleLaunchKernel.argtypes = [vp] + [u] * 7 + [vp, vp, vp]
        self.lib = lib
        self.check(lib.hipInit(0), "hipInit")

    def check(self, res, what):
        if res != 0:
            name = self.lib.hipGetErrorName(res)
            raise RuntimeError(f"{what}: {name.decode() if name else f'HIP error {res}'}")

    def primary_context(self, ordinal):
        return ordinal  # the device stands for the context

    def current(self, ordinal):
        return _HipCurrent(self, ordinal)

    def load_module(self, data, path):
        module = ctypes.c_void_p()
        self.check(self.lib.hipModuleLoadData(ctypes.byref(module), data), f"hipModuleLoadData {path}")
        return module

    def get_function(self, module, entry, smem):
        if smem > self.LDS_BYTES:
            raise Error(f"{entry}: {smem} bytes of dynamic shared memory, more than the {self.LDS_BYTES} a HIP kernel may use")
        fn = ctypes.c_void_p()
        self.check(self.lib.hipModuleGetFunction(ctypes.byref(fn), module, entry.encode()), f"hipModuleGetFunction {entry}")
        return fn

    def resident_blocks(self, fn, threads, smem):
        """0: HIP launches cap their KV splits by no occupancy count."""
        return 0

    def launch(self, fn, grid, threads, smem, stream, params):
        """hipModuleLaunchKernel's result (0: launched)."""
        return self.lib.hipModuleLaunchKernel(fn, grid[0], grid[1], grid[2], threads, 1, 1, smem, stream, params, None)

    def error_name(self, res):
        name = self.lib.hipGetErrorName(res)
        return name.decode() if name else f"HIP error {res}"

    def encode_tensor_map(self, *args):
        """Refused: tensor maps are CUDA's (HIP libraries have no tensor-map arguments)."""
        raise Error("a CUDA tensor map cannot be encoded through the HIP runtime (HIP libraries have no tensor-map arguments)")


class _HipCurrent:
    """Makes `ordinal` the calling thread's current HIP device for a while."""

    def __init__(self, driver, ordinal):
        self.driver, self.ordinal, self.old = driver, ordinal, None

    def __enter__(self):
        cur = ctypes.c_int()
        self.driver.check(self.driver.lib.hipGetDevice(ctypes.byref(cur)), "hipGetDevice")
        if cur.value != self.ordinal:
            self.driver.check(self.driver.lib.hipSetDevice(self.ordinal), f"hipSetDevice({self.ordinal})")
            self.old = cur.value

    def __exit__(self, *exc):
        if self.old is not None:
            self.driver.check(self.driver.lib.hipSetDevice(self.old), f"hipSetDevice({self.old})")
            self.old = None


_drivers = {}


def _get_driver(hip=False):
    key = "hip" if hip else "cuda"
    if key not in _drivers:
        _drivers[key] = _HipDriver() if hip else _Driver()
    return _drivers[key]


def hip_arch(gcn_arch_name):
    """The architecture of a ROCm device's `gcnArchName`
    (`gfx942:sramecc+:xnack-` -> `gfx942`)."""
    arch = (gcn_arch_name or "").split(":")[0]
    if not arch.startswith("gfx"):
        raise Error(
            f"cannot tell the AMD GPU's architecture from gcnArchName {gcn_arch_name!r} "
            f"(torch.cuda.get_device_properties; PyTorch for ROCm 5.x or newer reports it)"
        )
    return arch


# --------------------------------------------------------------------------
# Libraries and variants (PyTorch).


def _torch():
    try:
        import torch
    except ImportError:
        raise Error("aec_library needs PyTorch to load a library (`import torch` failed)") from None
    return torch


def load(directory, device=None):
    """The kernel library in `directory` (what `aec compile -o` wrote), for
    the GPU `device` (an index, `"cuda:N"` or a torch.device; the current
    device when None). With PyTorch built for CUDA the library's cubins run;
    with PyTorch built for ROCm (whose GPUs are `cuda` devices too), its HIP
    code objects."""
    manifest = read_manifest(directory)
    torch = _torch()
    hip = bool(getattr(torch.version, "hip", None))
    if not torch.cuda.is_available():
        kind = "AMD GPU (PyTorch for ROCm)" if hip else "CUDA device"
        raise Error(f"no {kind}: torch.cuda.is_available() is False")
    if device is None:
        index = torch.cuda.current_device()
    else:
        d = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
        if d.type != "cuda":
            raise Error(f"device {device!r}: the kernels run on GPU (`cuda`) devices only")
        index = d.index if d.index is not None else torch.cuda.current_device()
    if hip:
        capability = None
        arch = hip_arch(getattr(torch.cuda.get_device_properties(index), "gcnArchName", ""))
    else:
        capability = torch.cuda.get_device_capability(index)
        arch = arch_for_capability(capability)
    check_arch(manifest, arch, capability)
    return Library(directory, manifest, index, arch)


class Library:
    """A loaded kernel library: `lib.variants`, `lib["Softmax"]`, `lib.Softmax`."""

    def __init__(self, directory, manifest, device_index, arch):
        torch = _torch()
        self.dir = os.path.abspath(directory)
        self.manifest = manifest
        self.arch = arch
        self.device = torch.device("cuda", device_index)
        #: The driver's name of the device: the tuning table's kernels are
        #: chosen for GPUs of this name.
        self.device_name = torch.cuda.get_device_name(device_index)
        props = torch.cuda.get_device_properties(device_index)
        self.sms = props.multi_processor_count
        #: Shared memory per multiprocessor (the KV-split rule's wave cap;
        #: 0 where PyTorch does not report it).
        self.smem_per_sm = int(getattr(props, "shared_memory_per_multiprocessor", 0) or 0)
        with torch.cuda.device(device_index):
            torch.zeros(1, device=self.device)  # PyTorch's context exists from here on
        #: "cuda" or "hip": the driver the kernels go through.
        self.backend = "hip" if is_hip_arch(arch) else "cuda"
        self._driver = _get_driver(self.backend == "hip")
        self._ctx = self._driver.primary_context(device_index)
        self._modules = {}  # code object path -> module
        self._functions = {}  # (code object path, entry) -> function
        self._variants = {v["name"]: Variant(self, v) for v in manifest["variants"]}

    @property
    def variants(self):
        return list(self._variants)

    def __getitem__(self, name):
        try:
            return self._variants[name]
        except KeyError:
            raise Error(f"no variant {name!r} in {self.dir}; it has: {', '.join(self._variants)}") from None

    def __getattr__(self, name):
        variants = self.__dict__.get("_variants") or {}
        if name in variants:
            return variants[name]
        raise AttributeError(f"{type(self).__name__} has no attribute or variant {name!r} (variants: {', '.join(variants)})")

    def __dir__(self):
        return list(super().__dir__()) + self.variants

    def __repr__(self):
        return f"<aec library {self.dir}: {', '.join(self.variants)} on {self.device} ({self.arch})>"

    def _function(self, cubin, entry, smem):
        key = (cubin, entry)
        fn = self._functions.get(key)
        if fn is not None:
            return fn
        drv = self._driver
        with drv.current(self._ctx):
            module = self._modules.get(cubin)
            if module is None:
                path = os.path.join(self.dir, cubin)
                try:
                    with open(path, "rb") as fh:
                        data = fh.read()
                except OSError as e:
                    raise Error(f"{path}: {e.strerror or e}") from None
                module = drv.load_module(data, path)
                self._modules[cubin] = module
            fn = drv.get_function(module, entry, smem)
        self._functions[key] = fn
        return fn


_TORCH_DTYPES = {}


def _dtype_name(torch, dtype):
    if not _TORCH_DTYPES:
        _TORCH_DTYPES.update({torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"})
    return _TORCH_DTYPES.get(dtype, str(dtype))


def _info(torch, t, where, name):
    if not isinstance(t, torch.Tensor):
        raise Error(f"{where}: {name}: expected a torch.Tensor, got {type(t).__name__}")
    return TensorInfo(
        tuple(t.shape),
        _dtype_name(torch, t.dtype),
        f"cuda:{t.get_device()}" if t.is_cuda else str(t.device),
        t.is_contiguous(),
        t.data_ptr() % ALIGN_BYTES == 0,
    )


def _params(args):
    """A launch's kernel parameters as cuLaunchKernel and hipModuleLaunchKernel take them (an array of
    pointers to the values), the pointer slots a call fills in: (slot,
    buffer name), and the tensor maps it encodes: (host address of the
    map's 128 bytes, 64-byte aligned, TensorMapArg); null pointers and the
    32-bit sizes are set once."""
    values, addresses, slots, maps = [], [], [], []
    for kind, v in args:
        if kind == "ptr":
            values.append(ctypes.c_uint64(0))
            if v is not None:
                slots.append((values[-1], v))
        elif kind == "tensor_map":
            # A CUtensorMap by value: 128 bytes at a 64-byte-aligned address
            # inside a larger buffer (ctypes aligns its buffers to 16 at most).
            room = ctypes.create_string_buffer(TENSOR_MAP_BYTES + TENSOR_MAP_ALIGN - 1)
            address = (ctypes.addressof(room) + TENSOR_MAP_ALIGN - 1) & ~(TENSOR_MAP_ALIGN - 1)
            values.append(room)
            addresses.append(address)
            maps.append((address, v))
            continue
        elif kind == "i32":
            values.append(ctypes.c_int32(v))
        else:
            raise Error(f"unknown kernel argument kind {kind!r}")
        addresses.append(ctypes.addressof(values[-1]))
    params = (ctypes.c_void_p * len(addresses))(*addresses)
    params._values = values  # keeps the values alive with the array
    return params, slots, maps


def _fit(t, dtype):
    """A contiguous, aligned `t` of `dtype` (for tensors the module makes, such as dO)."""
    t = t.to(dtype).contiguous()
    if t.data_ptr() % ALIGN_BYTES:
        t = t.clone()
    return t


class Variant:
    """One variant of a library. Parallel: `variant(q, k, v, **customs)`;
    recurrent: `variant(q, k, v, **customs, initial_state=None,
    initial_norm=None, output_final_state=False)`; any pass:
    `variant.run(pass_name, tensors, want=(), kv_splits=None)`."""

    def __init__(self, library, record):
        self.library = library
        self.record = record
        self.name = record["name"]
        self.pattern = record["pattern"]
        #: The declared inputs in order: q, k, v, then the custom inputs.
        self.input_names = [i["name"] for i in record["inputs"]]
        self.custom_names = self.input_names[3:]
        self._plans = {}
        self._tuned_plans = {}  # source -> (Plan, cubin) of the tuning table's records
        self._calls = {}  # checked calls by shapes (see run)
        self._backward_note = backward_unavailable(record, library.arch)
        #: The number of KV splits of the last call (1 without split-KV).
        self.last_kv_splits = None
        #: The kernel entry the last call ran first, and the `tuned_for`
        #: item of the tuning table that chose it (None: the default).
        self.last_entry = None
        self.last_tuned_for = None

    def __repr__(self):
        return f"<aec {self.pattern} variant {self.name}({', '.join(self.input_names)})>"

    @property
    def backward_note(self):
        """Why the variant has no backward here (None when it has one)."""
        return self._backward_note

    @property
    def has_backward(self):
        return self.backward_note is None

    def plan(self, pass_name):
        """The Plan of `pass_name` on the library's architecture, with its cubin."""
        if pass_name not in self._plans:
            record, build = select_build(self.record, pass_name, self.library.arch)
            plan = Plan(self.name, record["plan"])
            if self.pattern == "recurrent":
                plan.labels = {"state_in": "initial_state", "norm_in": "initial_norm"}
            modules = build_modules(self.record, record, build)
            self._plans[pass_name] = (plan, binary_of(build), modules)
        return self._plans[pass_name][0]

    def _resident(self, plan, cubin, modules):
        """The blocks of `plan`'s split launch (in `cubin` or one of `modules`)
        one multiprocessor holds at once, by the driver (registers included):
        the KV-split rule's wave cap; 0 without a split launch or a count."""
        launch = plan.split_launch()
        if launch is None:
            return 0
        lib = self.library
        module = launch.get("module")
        smem = int(launch["dynamic_smem_bytes"])
        fn = lib._function(cubin if module is None else modules[module], launch["entry"], smem)
        with lib._driver.current(lib._ctx):
            return lib._driver.resident_blocks(fn, int(launch["threads"]), smem)

    def run(self, pass_name, tensors, want=(), kv_splits=None):
        """Runs the plan of `pass_name` on `tensors` (name -> torch tensor:
        its inputs, and optional inputs or None), allocating its outputs and
        workspaces; returns its outputs (and the optional outputs named in
        `want`) by name. `kv_splits` forces the number of KV splits."""
        torch = _torch()
        lib = self.library
        plan = self.plan(pass_name)
        given = {n: t for n, t in tensors.items() if t is not None}
        for one, other in plan.plan.get("same_tensor", []):
            # V read from K's rows: the one cache is passed as both.
            if one in given and other in given and given[one] is not given[other] and (
                    given[one].data_ptr() != given[other].data_ptr() or given[one].shape != given[other].shape):
                raise Error(f"{plan.where}: `{one}` must be the tensor given as `{other}`: {plan.buffers[one]['doc']}")
        infos = {n: _info(torch, t, plan.where, n) for n, t in given.items()}
        want = tuple(want)
        # A call of the same shapes (and dtypes, devices, layouts) as an
        # earlier one that passed the checks launches the same way.
        key = (pass_name, want, kv_splits) + tuple(
            (n, i.shape, i.dtype, i.device, i.contiguous, i.aligned) for n, i in infos.items()
        )
        call = self._calls.get(key)
        if call is None:
            hip = lib.backend == "hip"
            _, cubin, modules = self._plans[pass_name]
            call = plan.prepare(infos, want=want, sms=lib.sms, kv_splits=kv_splits, device=str(lib.device), hip=hip,
                                smem_per_sm=lib.smem_per_sm, resident=self._resident(plan, cubin, modules))
            call.tuned_for = None
            tuned = select_tuned(self.record, pass_name, lib.arch, lib.device_name, call.sizes, lib.sms)
            if tuned is not None:
                record, build, call_tuned_for = tuned
                # A backward record has three entries: its source names it.
                tuned_id = record["source"]
                if tuned_id not in self._tuned_plans:
                    self._tuned_plans[tuned_id] = (Plan(self.name, record["plan"]), binary_of(build))
                tuned_plan, cubin = self._tuned_plans[tuned_id]
                modules = build_modules(self.record, record, build)
                call = tuned_plan.prepare(infos, want=want, sms=lib.sms, kv_splits=kv_splits, device=str(lib.device), hip=hip,
                                smem_per_sm=lib.smem_per_sm, resident=self._resident(tuned_plan, cubin, modules))
                call.tuned_for = call_tuned_for
            dtypes = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
            call.torch_allocations = [(n, dtypes[d], s, z) for n, d, s, z in call.allocations]
            call.functions = [
                lib._function(cubin if m is None else modules[m], entry, smem)
                for (entry, _, _, smem, _), m in zip(call.launches, call.modules)
            ]
            call.params = [_params(args) for _, _, _, _, args in call.launches]  # (params, slots, maps)
            call.lock = threading.Lock()
            call.map_addresses = {}  # host address of a map's bytes -> the tensor address encoded there
            if len(self._calls) >= 256:
                self._calls.clear()
            self._calls[key] = call
        bufs = dict(given)
        for name, dtype, shape, zeroed in call.torch_allocations:
            bufs[name] = (torch.zeros if zeroed else torch.empty)(shape, dtype=dtype, device=lib.device)
        drv = lib._driver
        stream = ctypes.c_void_p(torch.cuda.current_stream(lib.device).cuda_stream)
        with call.lock, drv.current(lib._ctx):
            encoded = {}  # (TensorMapArg, tensor address) -> a map of them encoded by this call
            for fn, (entry, grid, threads, smem, _), (params, slots, maps) in zip(call.functions, call.launches, call.params):
                for slot, name in slots:
                    slot.value = bufs[name].data_ptr()
                # Tensor maps hold their tensor's address: encoded for this
                # call's tensors (the launch copies the bytes) — unless this
                # slot already holds the map of the same tensor address (the
                # shapes are the call's key), or another launch of this call
                # encoded it (copied).
                for address, arg in maps:
                    ptr = bufs[arg.buffer].data_ptr()
                    if call.map_addresses.get(address) != ptr:
                        same = encoded.get((arg, ptr))
                        if same is None:
                            encode_tensor_map(drv, address, arg, ptr, f"{plan.where}: launch {entry}")
                        else:
                            ctypes.memmove(address, same, TENSOR_MAP_BYTES)
                        call.map_addresses[address] = ptr
                    encoded.setdefault((arg, ptr), address)
                res = drv.launch(fn, grid, threads, smem, stream, params)
                if res:
                    drv.check(res, f"{plan.where}: {drv.LAUNCH} {entry} grid {_dims(grid)} block {threads} smem {smem}")
        self.last_kv_splits = call.kv_splits
        self.last_entry = call.launches[0][0]
        self.last_tuned_for = call.tuned_for
        return {n: bufs[n] for n in call.outputs}

    def __call__(self, q, k, v, **kwargs):
        if self.pattern == "recurrent":
            return self._recurrent(q, k, v, **kwargs)
        return self._parallel(q, k, v, **kwargs)

    def _customs(self, given):
        unknown = [n for n in given if n not in self.custom_names]
        if unknown:
            takes = ", ".join(self.custom_names) or "no custom inputs"
            raise Error(f"{self.name}: unknown input `{unknown[0]}`; besides q, k, v it takes {takes}")
        missing = [n for n in self.custom_names if given.get(n) is None]
        if missing:
            raise Error(f"{self.name}: missing custom input{'s' if len(missing) > 1 else ''} " + ", ".join(f"`{n}`" for n in missing))
        return [given[n] for n in self.custom_names]

    def _parallel(self, q, k, v, **customs):
        values = self._customs(customs)
        return _autograd().Parallel.apply(self, q, k, v, *values)

    def _recurrent(self, q, k, v, initial_state=None, initial_norm=None, output_final_state=False, **customs):
        values = self._customs(customs)
        plan = self.plan("forward")
        normalized = "norm_in" in plan.buffers
        if initial_norm is not None and not normalized:
            raise Error(f"{self.name}: initial_norm given, but {self.name} keeps no normaliser")
        out = _autograd().Recurrent.apply(self, bool(output_final_state), q, k, v, initial_state, initial_norm, *values)
        if not output_final_state:
            return out[0] if isinstance(out, tuple) else out
        return tuple(out) if normalized else tuple(out[:2])


_functions = None


def _autograd():
    """The autograd functions, made once PyTorch is there."""
    global _functions
    if _functions is not None:
        return _functions
    torch = _torch()
    from torch.autograd.function import once_differentiable

    class Parallel(torch.autograd.Function):
        """o = variant(q, k, v, *customs); the backward runs the variant's
        backward plan on the forward's o and row outputs."""

        @staticmethod
        def forward(ctx, variant, q, k, v, *customs):
            names = variant.input_names
            out = variant.run("forward", dict(zip(names, (q, k, v) + customs)))
            ctx.variant = variant
            ctx.save_for_backward(q, k, v, *customs, out["o"], out["row_outputs"])
            return out["o"]

        @staticmethod
        @once_differentiable
        def backward(ctx, do):
            variant = ctx.variant
            note = variant.backward_note
            if note is not None:
                raise RuntimeError(f"{variant.name}: no backward on {variant.library.arch}: {note}")
            saved = ctx.saved_tensors
            inputs, o, rows = saved[:-2], saved[-2], saved[-1]
            tensors = dict(zip(variant.input_names, inputs))
            tensors.update(o=o, row_outputs=rows, dout=_fit(do, o.dtype))
            g = variant.run("backward", tensors)
            grads = [g["dq"], g["dk"], g["dv"]]
            for name, t in zip(variant.custom_names, inputs[3:]):
                grads.append(g["d" + name].to(t.dtype).reshape(t.shape))
            need = ctx.needs_input_grad[1:]
            return (None,) + tuple(x if n else None for x, n in zip(grads, need))

    class Recurrent(torch.autograd.Function):
        """(o, state_out, norm_out) = variant(q, k, v, state_in, norm_in,
        *customs); the backward runs the variant's backward plan (its states
        pass recomputes the state before each chunk from the same inputs)
        with the gradients of o and, where they were returned, of the final
        state and normaliser."""

        @staticmethod
        def forward(ctx, variant, want_state, q, k, v, state_in, norm_in, *customs):
            ctx.variant = variant
            ctx.set_materialize_grads(False)
            plan = variant.plan("forward")
            normalized = "norm_in" in plan.buffers
            tensors = dict(zip(variant.input_names, (q, k, v) + customs))
            tensors.update(state_in=state_in)
            if normalized:
                tensors.update(norm_in=norm_in)
            want = [n for n in ("state_out", "norm_out") if want_state and n in plan.buffers]
            out = variant.run("forward", tensors, want=want)
            ctx.want = want
            ctx.has_state = (state_in is not None, norm_in is not None)
            ctx.save_for_backward(q, k, v, state_in, norm_in, *customs)
            results = [out["o"]] + [out[n] for n in want]
            return tuple(results) if len(results) > 1 else results[0]

        @staticmethod
        @once_differentiable
        def backward(ctx, do, *state_grads):
            variant = ctx.variant
            note = variant.backward_note
            if note is not None:
                raise RuntimeError(f"{variant.name}: no backward on {variant.library.arch}: {note}")
            q, k, v, state_in, norm_in, *customs = ctx.saved_tensors
            plan = variant.plan("backward")
            if do is None:
                do = torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=v.dtype, device=v.device)
            tensors = dict(zip(variant.input_names, [q, k, v] + customs))
            tensors["do"] = _fit(do, v.dtype)
            tensors["state_in"] = state_in
            if "norm_in" in plan.buffers:
                tensors["norm_in"] = norm_in
            seeds = {"state_out": "d_state_out", "norm_out": "d_norm_out"}
            for name, g in zip(ctx.want, state_grads):
                if g is not None:
                    tensors[seeds[name]] = _fit(g, torch.float32)
            # Gradients of the initial state and normaliser where they were given.
            need = ctx.needs_input_grad
            want = []
            if ctx.has_state[0] and need[5]:
                want.append("d_state_in")
            if ctx.has_state[1] and need[6] and "d_norm_in" in plan.buffers:
                want.append("d_norm_in")
            g = variant.run("backward", tensors, want=want)
            grads = [g["dq"], g["dk"], g["dv"], g.get("d_state_in"), g.get("d_norm_in")]
            for name, t in zip(variant.custom_names, customs):
                grads.append(g["d" + name].to(t.dtype).reshape(t.shape))
            return (None, None) + tuple(x if n else None for x, n in zip(grads, need[2:]))

    class Functions:
        pass

    Functions.Parallel, Functions.Recurrent = Parallel, Recurrent
    _functions = Functions
    return _functions
