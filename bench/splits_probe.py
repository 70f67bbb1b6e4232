# Times the decode kernel of decode-gqa-b1-h32-kv8-kv32768-d128 at forced KV
# split counts (GPU machine, after bench/cases is generated):
#   python bench/splits_probe.py
# Output: bench/results/2026-11-22-nvidia-h100-decode-splits.txt.
import sys, json, torch
sys.argv=["x","bench/cases"]
sys.path.insert(0, "bench")
import gpu_check as g
torch.zeros(1, device="cuda")  # PyTorch creates the context our module loads into
ix=json.load(open("bench/cases/index.json"))
e=[x for x in ix["bench"] if x["workload"]=="decode-gqa-b1-h32-kv8-kv32768-d128"][0]
k=g.Kernel("bench/cases", e["kernel"])
for skv in (32768, 8192):
    b,h,hkv,sq,d=1,32,8,1,128
    q=torch.randn(b,h,sq,d,device="cuda",dtype=torch.bfloat16)
    kk=torch.randn(b,hkv,skv,d,device="cuda",dtype=torch.bfloat16)
    v=torch.randn(b,hkv,skv,d,device="cuda",dtype=torch.bfloat16)
    sizes=dict(B=b,H=h,Hkv=hkv,Sq=sq,Skv=skv)
    nbytes=2*b*(hkv*skv*2*d)
    for n in (None,1,8,16,33,66,128):
        k.splits_override=n
        ms=g.bench(lambda: k(q,kk,v,{},sizes))
        print(f"skv {skv} splits {k.last_splits:4d} {'(rule)' if n is None else '':7s} {ms*1e3:8.1f} us {nbytes/(ms*1e-3)/1e9:7.0f} GB/s", flush=True)
