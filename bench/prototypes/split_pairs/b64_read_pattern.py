"""GQA B64 decoding's read pattern against a persistent one (bench/NOTES.md session 70): bench/read_floor.cu's kernels at
B64 x Hkv 8 x 4096 x d128, three rounds. Run from the repository root on a GPU machine: python bench/prototypes/split_pairs/b64_read_pattern.py"""
import ctypes, os, sys
sys.path.insert(0, os.path.join(os.getcwd(), "bench"))
import torch
import read_floor as rf
from gpu_check import bench_graph, copy_bandwidth, get_function
b, hkv, skv, d = 64, 8, 4096, 128
torch.zeros(1, device="cuda")
m = rf.probe_module()
sms = torch.cuda.get_device_properties(0).multi_processor_count
half = b * hkv * skv * d * 2
total = 2 * half
n_sets = max(2, -(-(256 << 20) // total))
sets = [(torch.randn(half // 2, device="cuda", dtype=torch.bfloat16), torch.randn(half // 2, device="cuda", dtype=torch.bfloat16)) for _ in range(n_sets)]
out = torch.zeros(4, dtype=torch.int32, device="cuda")
def ptrs(i): return [ctypes.c_void_p(sets[i][0].data_ptr()), ctypes.c_void_p(sets[i][1].data_ptr())]
for rnd in range(3):
    copy = copy_bandwidth()
    print(f"round {rnd}: copy {copy:.0f} GB/s")
    def log(what, ms):
        gbps = total / (ms * 1e-3) / 1e9
        print(f"  {what:60s} {ms*1e3:8.2f} us {gbps:6.0f} GB/s {gbps/copy:.3f} of copy", flush=True)
    for chunk, stages, grid in [(32768, 6, sms), (65536, 3, sms), (16384, 3, 512), (16384, 4, 512), (32768, 3, 512), (8192, 4, 512)]:
        fn = get_function(m, "read_bulk2", chunk * stages)
        log(f"bulk K,V same range {chunk>>10}K x{stages} grid {grid}", bench_graph(lambda i: rf.launch(fn, grid, 128, chunk * stages, ptrs(i) + [ctypes.c_longlong(half), ctypes.c_int(chunk), ctypes.c_int(stages), ctypes.c_void_p(out.data_ptr())]), n_sets))
    for rows, stages, threads in [(32, 3, 64), (32, 4, 64), (32, 3, 128), (64, 3, 128)]:
        cp = get_function(m, "read_cp_async", stages * 2 * rows * 256)
        log(f"cp.async {rows}-row steps x{stages}, 512 blocks of {threads}", bench_graph(lambda i: rf.launch(cp, 512, threads, stages * 2 * rows * 256, ptrs(i) + [ctypes.c_longlong(half), ctypes.c_int(rows), ctypes.c_int(stages), ctypes.c_void_p(out.data_ptr())]), n_sets))
