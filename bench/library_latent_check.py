"""GPU check of a kernel library built with shared K/V storage (`aec compile
--v-in-k`), through its Python module, on a GPU machine.

    # here, with NVRTC:
    aec compile examples/mla_decode.rs --target h100 --v-in-k --no-tuning -o LIBDIR
    # there:
    python bench/library_latent_check.py LIBDIR

Multi-head latent attention decoding (examples/mla_decode.rs): one latent
cache [B, 1, Skv, 576] passed as both k and v; V is its first 512 columns.
Checks the forward against a float64 reference (softmax of q · cacheᵀ / √192
over the keys, times the cache's first 512 columns) at shapes whose key
counts are not multiples of the tiles, with the split rule's and forced KV
splits, then that a v which is another tensor (even an equal copy) is
refused with a message naming both. Tolerance: max|ours − ref| / max|ref| ≤
2e-2. Results go to $OUT/library_latent_check.json; exit status 1 if any
check fails.
"""
import datetime
import json
import math
import os
import sys
import traceback

import torch

OUT = os.environ.get("OUT", "/tmp/aec-out")
TOL = 2e-2
if len(sys.argv) != 2:
    sys.exit(__doc__)
LIBDIR = sys.argv[1]
sys.path.insert(0, os.path.abspath(os.path.join(LIBDIR, "python")))
import aec_library  # noqa: E402

dev = torch.device("cuda")
checks = []


def record(name, passed, **row):
    checks.append(dict(check=name, passed=passed, **row))
    detail = " ".join(f"{k}={v:.2e}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items())
    print(f"{'PASS' if passed else 'FAIL'} {name} {detail}", flush=True)


def reference(q, cache, dv):
    s = q.double() @ cache.double().transpose(-1, -2) / math.sqrt(192.0)
    return torch.softmax(s, dim=-1) @ cache.double()[..., :dv]


def check_forward(variant, b, h, skv, splits):
    name = f"forward B{b} H{h} Skv{skv} splits={splits or 'rule'}"
    try:
        torch.manual_seed(skv)
        q = torch.randn(b, h, 1, 576, device=dev, dtype=torch.bfloat16)
        cache = torch.randn(b, 1, skv, 576, device=dev, dtype=torch.bfloat16)
        out = variant.run("forward", {"q": q, "k": cache, "v": cache}, kv_splits=splits)["o"]
        ref = reference(q, cache, out.shape[-1])
        err = ((out.double() - ref).abs().max() / ref.abs().max()).item()
        record(name, err <= TOL, rel_err=err, kv_splits=variant.last_kv_splits, entry=variant.last_entry)
    except Exception as e:  # a failed row, never a crash
        record(name, False, error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc())


def check_refusal(variant):
    q = torch.randn(1, 16, 1, 576, device=dev, dtype=torch.bfloat16)
    cache = torch.randn(1, 1, 100, 576, device=dev, dtype=torch.bfloat16)
    try:
        variant.run("forward", {"q": q, "k": cache, "v": cache.clone()})
        record("v apart from k is refused", False, error="no error")
    except aec_library.Error as e:
        text = str(e)
        record("v apart from k is refused", "`v`" in text and "`k`" in text, message=text)


def main():
    os.makedirs(OUT, exist_ok=True)
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    lib = aec_library.load(LIBDIR)
    print(f"{lib!r}", flush=True)
    variant = lib.MlaDecode
    for b, h, skv in ((4, 16, 1000), (2, 32, 333), (1, 128, 4097)):
        for splits in (None, 1, 3):
            check_forward(variant, b, h, skv, splits)
    check_refusal(variant)
    ok = all(c["passed"] for c in checks)
    with open(os.path.join(OUT, "library_latent_check.json"), "w") as fh:
        json.dump(dict(device=torch.cuda.get_device_name(), date=started, torch=torch.__version__,
                       command="python bench/library_latent_check.py " + LIBDIR, library=os.path.abspath(LIBDIR),
                       arch=lib.arch, tolerance=TOL, passed=ok, checks=checks), fh, indent=1)
    print(f"{sum(c['passed'] for c in checks)}/{len(checks)} checks passed", flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
