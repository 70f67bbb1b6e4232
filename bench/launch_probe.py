"""Launch facts for a decoding kernel's design, on a GPU machine.

    nvcc -cubin -arch sm_90a bench/launch_probe.cu -o launch_probe.cubin   # here
    python bench/launch_probe.py launch_probe.cubin                        # there

A block of 128 threads holding 200 KB of shared memory (one per SM, as the
decoding tile for few blocks) spins for a set time. Prints, for thread-block
clusters of 1 to 16 blocks, how many clusters the driver says can be
resident (cuOccupancyMaxActiveClusters) and whether 128 such blocks run in
one wave; then the time per kernel of CUDA graphs of 24 back-to-back
128-block kernels, with and without programmatic dependent launch (each
kernel waits for its predecessor with griddepcontrol.wait before its work,
as any kernel that reads its predecessor's output must).
"""
import ctypes, os, sys, torch
if len(sys.argv) != 2:
    sys.exit(__doc__)
torch.zeros(1, device="cuda")
cu = ctypes.CDLL("libcuda.so.1")
def ck(r, w):
    if r: raise RuntimeError(f"{w}: CUDA error {r}")
mod = ctypes.c_void_p(); ck(cu.cuModuleLoadData(ctypes.byref(mod), open(sys.argv[1], "rb").read()), "load")
fn = ctypes.c_void_p(); ck(cu.cuModuleGetFunction(ctypes.byref(fn), mod, b"spin"), "fn")
SMEM = 200 * 1024
# CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, _NON_PORTABLE_CLUSTER_SIZE_ALLOWED (cuda.h).
ck(cu.cuFuncSetAttribute(fn, 8, SMEM), "smem")
ck(cu.cuFuncSetAttribute(fn, 14, 1), "nonportable")
# CUlaunchAttribute and CUlaunchConfig (cuda.h): an id, padding, a 64-byte value.
class Attr(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_uint * 16)]
class Cfg(ctypes.Structure):
    _fields_ = [("gx", ctypes.c_uint), ("gy", ctypes.c_uint), ("gz", ctypes.c_uint), ("bx", ctypes.c_uint), ("by", ctypes.c_uint),
                ("bz", ctypes.c_uint), ("smem", ctypes.c_uint), ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(Attr)), ("n", ctypes.c_uint)]
def cfg(grid, cluster, pdl, stream):
    attrs = (Attr * 2)()
    n = 0
    if cluster > 1:  # CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attrs[n].id = 4; attrs[n].value[0] = cluster; attrs[n].value[1] = 1; attrs[n].value[2] = 1; n += 1
    if pdl:  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attrs[n].id = 6; attrs[n].value[0] = 1; n += 1
    c = Cfg(grid, 1, 1, 128, 1, 1, SMEM, stream, attrs, n)
    c._keep = attrs
    return c
out = torch.zeros(3 * 256, dtype=torch.int64, device="cuda")
def launch(grid, cluster, ns, pdl, stream, rec=True):
    c = cfg(grid, cluster, pdl, stream)
    a = [ctypes.c_void_p(out.data_ptr() if rec else 0), ctypes.c_uint64(ns), ctypes.c_int(pdl)]
    args = (ctypes.c_void_p * 3)(*[ctypes.cast(ctypes.pointer(x), ctypes.c_void_p) for x in a])
    ck(cu.cuLaunchKernelEx(ctypes.byref(c), fn, args, None), "launch")
print(f"SMs {torch.cuda.get_device_properties(0).multi_processor_count}")
for cs in (1, 2, 4, 8, 16):
    n = ctypes.c_int()
    c = cfg(128, cs, 0, None)
    r = cu.cuOccupancyMaxActiveClusters(ctypes.byref(n), fn, ctypes.byref(c))
    s = torch.cuda.current_stream().cuda_stream
    try:
        launch(128, cs, 10000, 0, s); torch.cuda.synchronize()
        v = out.view(-1, 3)[:128].cpu().tolist()
        t0 = min(x[0] for x in v)
        starts = sorted((x[0] - t0) / 1e3 for x in v)
        ends = max((x[1] - t0) / 1e3 for x in v)
        print(f"cluster {cs:2d}: max active clusters {n.value} (rc {r}); 128 blocks x 10 us spin: starts {starts[0]:.2f}..{starts[-1]:.2f} us, span {ends:.2f} us, SMs {len(set(x[2] for x in v))}")
    except Exception as e:
        print(f"cluster {cs}: {e} (max active {n.value}, rc {r})")
# PDL: graphs of 24 back-to-back 128-block kernels spinning 20 us.
for pdl in (0, 1):
    for ns in (20000, 2000):
        s = torch.cuda.Stream()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.stream(s):
            launch(128, 1, ns, pdl, s.cuda_stream, rec=False)
        torch.cuda.synchronize()
        with torch.cuda.graph(g, stream=s):
            for _ in range(24):
                launch(128, 1, ns, pdl, s.cuda_stream, rec=False)
        g.replay(); torch.cuda.synchronize()
        ts = []
        for _ in range(10):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(); g.replay(); b.record(); b.synchronize(); ts.append(a.elapsed_time(b) * 1e3 / 24)
        ts.sort()
        print(f"pdl {pdl} spin {ns/1e3:.0f} us: per kernel {ts[5]:.2f} us (overhead {ts[5]-ns/1e3:.2f})")
