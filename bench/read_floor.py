"""The read floor of a decoding call's K/V bytes on this GPU.

`python bench/read_floor.py [B,Hkv,Skv,D]` (default 1,8,32768,128: the
`decode-gqa-b1-h32-kv8-kv32768-d128` workload's 134 MB of K and V) times,
in one process and as the benchmark times decoding (CUDA-graph replays over
rotating input sets larger than L2), plain reads of two buffers of that
size: `torch.sum`, 16-byte loads over the grid, bulk copies of contiguous
slices into a shared-memory ring, and bulk copies of one key range of both
K and V per block (the decoding kernels' access pattern, 16 splits of each
KV head), and `cp.async` steps in that pattern as the sm_80 template's
decoding loop issues them; each against the 1 GiB device-to-device copy that gpu_check.py
reports decoding against. Writes read_floor.json under $OUT. The kernels
(bench/read_floor.cu) are compiled with NVRTC at run time."""
import ctypes
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_check import OUT, bench_graph, check, copy_bandwidth, get_function, libcuda  # noqa: E402


def nvrtc_cubin(src, arch):
    """`src` compiled for `arch` (e.g. sm_90a) by NVRTC."""
    lib = _nvrtc()
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"read_floor.cu", 0, None, None) == 0
    opts = [f"--gpu-architecture={arch}".encode(), b"-std=c++17"]
    res = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    if res != 0:
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        raise RuntimeError("read_floor.cu: " + log.value.decode())
    size = ctypes.c_size_t()
    lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
    cubin = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetCUBIN(prog, cubin)
    return cubin.raw


def _nvrtc():
    """The first NVRTC library that loads."""
    for name in ("libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            pass
    raise RuntimeError("NVRTC (libnvrtc.so) not found")


def launch(fn, grid, block, smem, args):
    holders = list(args)
    arr = (ctypes.c_void_p * len(holders))(*[ctypes.addressof(a) for a in holders])
    check(libcuda.cuLaunchKernel(fn, grid, 1, 1, block, 1, 1, smem,
                                 ctypes.c_void_p(torch.cuda.current_stream().cuda_stream), arr, None), "cuLaunchKernel")


_MODULE = None


def probe_module():
    """read_floor.cu compiled for this GPU by NVRTC and loaded (once)."""
    global _MODULE
    if _MODULE is None:
        major, minor = torch.cuda.get_device_capability()
        arch = f"sm_{major}{minor}" + ("a" if major == 9 else "")
        src = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "read_floor.cu")).read()
        module = ctypes.c_void_p()
        check(libcuda.cuModuleLoadData(ctypes.byref(module), nvrtc_cubin(src, arch)), "cuModuleLoadData read_floor.cu")
        _MODULE = module
    return _MODULE


def bulk_floor_ms(pairs, na, nb):
    """The read floor of a decoding call's bytes, as gpu_check.py reports
    beside each decoding workload: milliseconds per call of the fastest bulk
    read (`read_bulk`, one block per SM streaming a slice of K‖V into a ring
    of 64 KiB × 3 or 32 KiB × 6) of two buffers of `na` and `nb` bytes, graph-timed
    over the input sets `pairs` (data pointers (a, b) per set) as the
    decoding kernels are. No kernel that reads those bytes can beat it by
    much: it reads and does nothing else."""
    module = probe_module()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = torch.zeros(4, dtype=torch.int32, device="cuda")
    best = None
    for chunk, stages in ((65536, 3), (32768, 6)):
        if na % chunk:
            continue  # (a chunk would straddle the two buffers)
        fn = get_function(module, "read_bulk", chunk * stages)
        ms = bench_graph(lambda i: launch(fn, sms, 128, chunk * stages, [
            ctypes.c_void_p(pairs[i][0]), ctypes.c_void_p(pairs[i][1]), ctypes.c_longlong(na), ctypes.c_longlong(nb),
            ctypes.c_int(chunk), ctypes.c_int(stages), ctypes.c_void_p(out.data_ptr())]), len(pairs))
        best = ms if best is None else min(best, ms)
    if best is None:
        raise ValueError(f"{na} bytes (the first buffer) is not a multiple of 32 KiB")
    return best


def main():
    b, hkv, skv, d = (int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "1,8,32768,128").split(","))
    torch.zeros(1, device="cuda")  # PyTorch's context, which the module loads into
    module = probe_module()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    half = b * hkv * skv * d * 2  # K's bytes (V's the same)
    total = 2 * half
    # Rotating sets: every replay reads past the L2 cache, as in gpu_check.py.
    n_sets = max(2, -(-(256 << 20) // total))
    sets = [(torch.randn(half // 2, device="cuda", dtype=torch.bfloat16),
             torch.randn(half // 2, device="cuda", dtype=torch.bfloat16)) for _ in range(n_sets)]
    out = torch.zeros(4, dtype=torch.int32, device="cuda")
    rows = []
    vec = get_function(module, "read_vec", 0)

    def log(copy, what, ms):
        row = dict(what=what, us=ms * 1e3, gbps=total / (ms * 1e-3) / 1e9)
        row["of_copy"] = row["gbps"] / copy
        rows.append(row)
        print(f"{what:58s} {row['us']:8.2f} us {row['gbps']:6.0f} GB/s = {row['of_copy']:.3f} of copy", flush=True)

    def ptrs(i):
        return [ctypes.c_void_p(sets[i][0].data_ptr()), ctypes.c_void_p(sets[i][1].data_ptr())]

    print(f"{torch.cuda.get_device_name()}: K and V of B {b} x Hkv {hkv} x Skv {skv} x D {d} ({total / 1e6:.0f} MB)")
    for rnd in range(2):
        copy = copy_bandwidth()
        rows.append(dict(what="copy 1 GiB", round=rnd, gbps=copy))
        print(f"round {rnd}: device-to-device copy {copy:.0f} GB/s", flush=True)
        log(copy, "torch.sum of K and of V", bench_graph(
            lambda i: (sets[i][0].sum(dtype=torch.float32), sets[i][1].sum(dtype=torch.float32)), n_sets))
        for per_sm, block in [(1, 512), (2, 512), (4, 256)]:
            grid = sms * per_sm
            log(copy, f"16-byte loads, {grid} x {block} threads", bench_graph(
                lambda i: launch(vec, grid, block, 0, ptrs(i) + [ctypes.c_longlong(half // 16), ctypes.c_void_p(out.data_ptr())]), n_sets))
        for name, label in (("read_bulk", "bulk copies of slices of K‖V"), ("read_bulk2", "bulk copies of one key range of K and V")):
            # read_bulk takes both buffers' sizes, read_bulk2 one (both alike).
            sizes = [ctypes.c_longlong(half)] * (2 if name == "read_bulk" else 1)
            for chunk, stages, grid in [(32768, 6, sms), (65536, 3, sms), (32768, 6, 16 * hkv * b), (65536, 3, 16 * hkv * b), (32768, 4, 16 * hkv * b)]:
                fn = get_function(module, name, chunk * stages)
                log(copy, f"{label}, {chunk >> 10} KiB x {stages}, {grid} blocks", bench_graph(
                    lambda i: launch(fn, grid, 128, chunk * stages, ptrs(i) + sizes + [ctypes.c_int(chunk), ctypes.c_int(stages), ctypes.c_void_p(out.data_ptr())]), n_sets))
        # The sm_80-template decoding kernel's loads: cp.async, 128-key steps
        # of K and V (64 KiB at d128) in three stages, 128 threads (its four
        # key warps), then more threads.
        cp = get_function(module, "read_cp_async", 3 * 2 * 128 * 256)
        for threads in (128, 256, 512):
            log(copy, f"cp.async, 128-row steps x 3, {16 * hkv * b} blocks of {threads}", bench_graph(
                lambda i: launch(cp, 16 * hkv * b, threads, 3 * 2 * 128 * 256, ptrs(i) + [ctypes.c_longlong(half), ctypes.c_int(128), ctypes.c_int(3), ctypes.c_void_p(out.data_ptr())]), n_sets))
        cp4 = get_function(module, "read_cp_async", 4 * 2 * 64 * 256)
        log(copy, f"cp.async, 64-row steps x 4, {16 * hkv * b} blocks of 128", bench_graph(
            lambda i: launch(cp4, 16 * hkv * b, 128, 4 * 2 * 64 * 256, ptrs(i) + [ctypes.c_longlong(half), ctypes.c_int(64), ctypes.c_int(4), ctypes.c_void_p(out.data_ptr())]), n_sets))
    with open(os.path.join(OUT, "read_floor.json"), "w") as fh:
        json.dump(dict(device=torch.cuda.get_device_name(), shape=[b, hkv, skv, d], rows=rows), fh, indent=1)


if __name__ == "__main__":
    main()
