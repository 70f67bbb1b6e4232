"""How many clusters of a cases directory's cluster-pair kernels a GPU holds at once.

    python bench/cluster_occupancy.py <cases_dir>

For each benchmark forward built with the K/V multicast (`aec-bench <dir>
--nvrtc --kv-multicast`: `cluster_pairs` in index.json, `__cluster_dims__(2,
1, 1)` in the kernel), loads its cubin, sets its dynamic shared memory and
asks the driver (cuOccupancyMaxActiveClusters) how many clusters of two can
be resident. The launch grid takes floor(SMs / 2) clusters
(KernelSource::launch_grid); fewer resident ones leave a second wave, which a
persistent kernel's static stride pays for in full. Prints one line a
kernel; exits 1 when any holds fewer than floor(SMs / 2).
"""
import ctypes, json, os, sys

if len(sys.argv) != 2:
    sys.exit(__doc__)
import torch  # the primary context, as the benchmark scripts use

torch.zeros(1, device="cuda")
cu = ctypes.CDLL("libcuda.so.1")


def ck(r, what):
    if r:
        raise RuntimeError(f"{what}: CUDA error {r}")


# CUlaunchConfig (cuda.h): grid, block, shared bytes, stream, attributes.
class Attr(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_uint * 16)]


class Cfg(ctypes.Structure):
    _fields_ = [("gx", ctypes.c_uint), ("gy", ctypes.c_uint), ("gz", ctypes.c_uint), ("bx", ctypes.c_uint),
                ("by", ctypes.c_uint), ("bz", ctypes.c_uint), ("smem", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(Attr)), ("n", ctypes.c_uint)]


dev = ctypes.c_int()
ck(cu.cuCtxGetDevice(ctypes.byref(dev)), "device")
sms = ctypes.c_int()
ck(cu.cuDeviceGetAttribute(ctypes.byref(sms), 16, dev), "SM count")  # CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
want = sms.value // 2
index = json.load(open(os.path.join(sys.argv[1], "index.json")))
short = False
for b in index["bench"]:
    k = b["kernel"]
    if not k.get("cluster_pairs"):
        continue
    mod = ctypes.c_void_p()
    ck(cu.cuModuleLoadData(ctypes.byref(mod), open(os.path.join(sys.argv[1], k["cubin"]), "rb").read()), "load")
    fn = ctypes.c_void_p()
    ck(cu.cuModuleGetFunction(ctypes.byref(fn), mod, k["name"].encode()), "function")
    # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    ck(cu.cuFuncSetAttribute(fn, 8, k["smem_bytes"]), "shared memory")
    # The cluster shape is the kernel's own (__cluster_dims__): no attribute.
    cfg = Cfg(2 * want, 1, 1, k["threads"], 1, 1, k["smem_bytes"], None, None, 0)
    n = ctypes.c_int()
    ck(cu.cuOccupancyMaxActiveClusters(ctypes.byref(n), fn, ctypes.byref(cfg)), "max active clusters")
    ok = n.value >= want
    short |= not ok
    print(f"{b['workload']}: {k['name']}, {k['smem_bytes']} B: {n.value} clusters of 2 resident, "
          f"the grid takes {want} ({sms.value} SMs){'' if ok else ': a second wave'}", flush=True)
sys.exit(1 if short else 0)
