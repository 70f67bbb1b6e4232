"""GPU check of a kernel library through its Python module, on a GPU machine.

    # here, with NVRTC (see the README; the tuning cache is optional, e.g.
    # the fixture of bench/src/bin/tuning_fixture.rs):
    aec compile examples/softmax.rs examples/sigmoid.rs examples/retnet_parallel.rs \
        examples/mamba2.rs examples/decode.rs --target h100 --head-dims 128 \
        --tuning-cache FIXTURE.json -o LIBDIR
    # there:
    python bench/library_check.py LIBDIR [--no-bench]

It imports LIBDIR/python/aec_library.py (templates/library/aec_library.py
where the library has none), loads the library on the current GPU and checks:

- correctness: Softmax, Sigmoid and RetnetParallel forward and backward
  (dq, dk, dv and custom-input gradients), Decode forward and backward with
  the split rule's and forced KV splits (when the library has it), and the
  Mamba2 forward (output, final state, with and without an initial state)
  and backward (q, k, v, a, dt and the initial state's gradients, the final
  state feeding the loss) against autograd through a float64 reference,
  at two shapes each whose sequence lengths are not multiples of 128, against
  float64 PyTorch references written here from examples/*.rs. Tolerance: a
  relative error max|ours - ref| / max|ref| of at most 2e-2 (bf16 inputs);
- the tuning table: for each tuning-table kernel of the library for this
  GPU (forward or backward; measured by `aec tune` or a declared workload's
  untuned tile), a call in each of its buckets runs it (checked
  as above, forward and backward) and a call outside runs the pass's default
  kernel (`variant.last_entry`); without any, a note (a failure where
  AEC_REQUIRE_TUNED=1);
- tensor maps: where the Softmax forward loads q, k and v with TMA copies
  (the sm_90a kernels take tensor maps of them, which the module encodes
  per call), calls of one shape on other tensors (the second from the
  module's cached plan, so a stale map would read the first call's
  tensors) and on views into the middle of larger tensors each match the
  reference; elsewhere a note;
- refusals: wrong dtype, wrong shape, non-contiguous and CPU tensors, a
  missing custom input, each a clear error naming
  the tensor (or the variant);
- speed (unless --no-bench): our Softmax forward and forward+backward next to
  torch's scaled_dot_product_attention (cuDNN and flash backends) at B=4,
  H=16, S=4096, D=128, non-causal, in this process, triton's do_bench median.

Results go to $OUT/library_check.json; the exit status is 1 if any check fails.
"""
import datetime
import json
import math
import os
import sys
import traceback
import zlib

import torch

OUT = os.environ.get("OUT", "/tmp/aec-out")
TOL = 2e-2

args = [a for a in sys.argv[1:] if not a.startswith("--")]
if len(args) != 1:
    sys.exit(__doc__)
LIBDIR = args[0]
HERE = os.path.dirname(os.path.abspath(__file__))
shipped = os.path.join(LIBDIR, "python")
MODULE_DIR = shipped if os.path.isfile(os.path.join(shipped, "aec_library.py")) else os.path.join(HERE, "..", "templates", "library")
sys.path.insert(0, os.path.abspath(MODULE_DIR))
import aec_library  # noqa: E402

dev = torch.device("cuda")
checks = []  # one row per check


def rel_err(ours, ref):
    """max|ours - ref| / max|ref|, in float64."""
    ours, ref = ours.double(), ref.double()
    return ((ours - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def record(name, **row):
    row = dict(check=name, **row)
    checks.append(row)
    status = "PASS" if row["passed"] else "FAIL"
    detail = " ".join(f"{k}={v:.2e}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()
                      if k not in ("check", "passed", "traceback"))
    print(f"{status} {name} {detail}", flush=True)


def guarded(name, fn, **row):
    """Runs a check; an exception is a failed row, never a crash."""
    try:
        fn()
    except Exception as e:
        record(name, passed=False, error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc(), **row)


# ----------------------------------------------------------------------------
# References, float64, from the variants' definitions (examples/*.rs).


def ref_softmax(q, k, v):
    """softmax.rs: q · rsqrt(Dqk), softmax over keys."""
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    return torch.softmax(s, dim=-1) @ v


def ref_decode(q, k, v):
    """decode.rs: softmax.rs with Hkv key/value heads, each serving H / Hkv query heads."""
    group = q.shape[1] // k.shape[1]
    return ref_softmax(q, k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1))


def ref_sigmoid(q, k, v):
    """sigmoid.rs: sigmoid(q·k / sqrt(Dqk) − log(Skv)), no normalisation."""
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    return torch.sigmoid(s - math.log(k.shape[2])) @ v


def ref_retnet(q, k, v, gamma):
    """retnet_parallel.rs: s = q·k (no scale) times gamma_h^(i−j) where i ≥ j, 0
    elsewhere; o = (s v) / max(Σ_j |s_ij|, 1)."""
    sq, skv = q.shape[2], k.shape[2]
    i = torch.arange(sq, device=q.device, dtype=torch.float64)[:, None]
    j = torch.arange(skv, device=q.device, dtype=torch.float64)[None, :]
    keep = i >= j
    dist = (i - j).clamp_min(0)  # masked entries never reach exp with a positive power
    decay = torch.exp(dist * torch.log(gamma)[:, None, None]) * keep  # [H, Sq, Skv]
    s = (q @ k.transpose(-1, -2)) * decay
    a = s.abs().sum(-1, keepdim=True)
    return (s @ v) / a.clamp_min(1.0)


def ref_mamba2(q, k, v, a, dt, state=None):
    """mamba2.rs: S_t = exp(dt_t a_h) S_{t-1} + k_t ⊗ (v_t dt_t), o_t = q_t · S_t
    (S is [Dk, Dv] per batch and head). Returns o and the final state."""
    b, h, s, dk = q.shape
    S = torch.zeros(b, h, dk, v.shape[-1], dtype=torch.float64, device=q.device) if state is None else state.double()
    o = []
    for t in range(s):
        g = torch.exp(dt[:, :, t] * a[None, :])[:, :, None, None]
        S = g * S + k[:, :, t, :, None] * (v[:, :, t, None, :] * dt[:, :, t, None, None])
        o.append((q[:, :, t, :, None] * S).sum(2))
    return torch.stack(o, dim=2), S


# ----------------------------------------------------------------------------
# Correctness.


def bf16(*shape):
    return torch.randn(*shape, device=dev).to(torch.bfloat16)


def check_parallel(lib, name, ref, sizes, customs, backward=True, kv_splits=(None,)):
    """Forward (and backward) of a parallel variant against `ref` in float64."""
    b, h, hkv, sq, skv, d = sizes
    shape = f"B={b} H={h} Hkv={hkv} Sq={sq} Skv={skv} D={d}"
    torch.manual_seed(zlib.crc32(f"{name} {sizes}".encode()))
    q, k, v = bf16(b, h, sq, d), bf16(b, hkv, skv, d), bf16(b, hkv, skv, d)
    cust = {n: make() for n, make in customs.items()}
    leaves64 = [t.double().requires_grad_() for t in [q, k, v] + list(cust.values())]
    o_ref = ref(*leaves64)
    variant = lib[name]

    for splits in kv_splits:
        def forward(splits=splits):
            if splits is None:
                o = variant(q, k, v, **cust)
            else:  # the generic call, forcing the number of KV splits
                o = variant.run("forward", dict(q=q, k=k, v=v, **cust), kv_splits=splits)["o"]
            torch.cuda.synchronize()
            err = rel_err(o, o_ref.detach())
            record(f"{name} forward", variant=name, shape=shape, kv_splits=variant.last_kv_splits,
                   kernel=variant.last_entry, tuned_for=variant.last_tuned_for,
                   rel_err_o=err, finite=bool(torch.isfinite(o).all()), passed=err <= TOL and bool(torch.isfinite(o).all()))
        guarded(f"{name} forward", forward, variant=name, shape=shape, kv_splits=splits)

    if not backward:
        return

    def grads():
        leaves = [t.clone().requires_grad_() for t in [q, k, v] + list(cust.values())]
        o = variant(*leaves[:3], **dict(zip(cust, leaves[3:])))
        do = torch.randn_like(o)
        ours = torch.autograd.grad(o, leaves, do)
        theirs = torch.autograd.grad(o_ref, leaves64, do.double())
        torch.cuda.synchronize()
        names = ["dq", "dk", "dv"] + ["d" + n for n in cust]
        errs = {n: rel_err(a, r) for n, a, r in zip(names, ours, theirs)}
        finite = all(bool(torch.isfinite(g).all()) for g in ours)
        row = {f"rel_err_{n}": e for n, e in errs.items()}
        record(f"{name} backward", variant=name, shape=shape, finite=finite,
               kernel=variant.last_entry, tuned_for=variant.last_tuned_for,
               passed=finite and all(e <= TOL for e in errs.values()), **row)
    guarded(f"{name} backward", grads, variant=name, shape=shape)


def inside(bucket):
    """A length of the power-of-two bucket `bucket` that is not a power of two where it can be."""
    return bucket if bucket <= 2 else bucket - bucket // 4 + 1


def first_entry(record):
    """The kernel a record's plan launches first (the forward's kernel, the
    backward's row kernel): what `last_entry` names after a call."""
    return record["plan"]["launches"][0]["entry"]


def check_tuning_table(lib, refs):
    """Every tuning-table kernel of the library for this GPU, forward and
    backward: a call in each of its buckets runs it (checked against
    float64), a call outside every bucket runs the pass's default."""
    found = 0
    for name in lib.variants:
        variant = lib[name]
        for k in variant.record["kernels"]:
            items = [t for t in k.get("tuned_for") or () if aec_library.is_for_gpu(t, lib.device_name, lib.sms)]
            pass_name = k.get("pass")
            if pass_name not in ("forward", "backward") or not items or name not in refs:
                continue
            default = next(r for r in variant.record["kernels"]
                           if r.get("pass") == pass_name and "plan" in r and not r.get("tuned_for")
                           and any(b.get("arch") == lib.arch for b in r.get("builds") or []))
            d = k["head_dims"]["Dqk"]
            for t in items:
                found += 1
                z = t["sizes"]
                sizes = (z["B"], z["H"], z["Hkv"], inside(z["Sq"]), inside(z["Skv"]), d)
                check_parallel(lib, name, refs[name], sizes, {})
                row = next(c for c in reversed(checks) if c["check"] == f"{name} {pass_name}")
                ran = row.get("kernel")
                record(f"{name} {pass_name} tuning table", variant=name, bucket=z, gpu=t.get("gpu") or t["device"],
                       chosen_by=t.get("chosen_by", "aec tune"), kernel=ran,
                       expected=first_entry(k), shape=row["shape"], passed=ran == first_entry(k) and row["passed"])
                outside = (z["B"], z["H"], z["Hkv"], 2 * z["Sq"] + 1, z["Skv"], d)
                check_parallel(lib, name, refs[name], outside, {}, backward=pass_name == "backward")
                row = next(c for c in reversed(checks) if c["check"] == f"{name} {pass_name}")
                record(f"{name} {pass_name} outside the tuning table", variant=name, shape=row["shape"],
                       kernel=row.get("kernel"), expected=first_entry(default),
                       passed=row.get("kernel") == first_entry(default) and row.get("tuned_for") is None and row["passed"])
    if not found:
        required = os.environ.get("AEC_REQUIRE_TUNED") == "1"
        record("tuning table", gpu=lib.device_name, note=f"the library has no tuning-table kernels for {lib.device_name}",
               passed=not required)


def check_mamba2(lib, sizes):
    b, h, s, dk, dv = sizes
    shape = f"B={b} H={h} S={s} Dk={dk} Dv={dv}"
    torch.manual_seed(s)
    q, k, v = bf16(b, h, s, dk), bf16(b, h, s, dk), bf16(b, h, s, dv)
    a = -(0.5 + 3.5 * torch.rand(h, device=dev))  # A_h < 0
    dt = 0.01 + 0.19 * torch.rand(b, h, s, device=dev)  # dt > 0
    state = torch.randn(b, h, dk, dv, device=dev)
    args64 = [t.double() for t in (q, k, v, a, dt)]
    m = lib.Mamba2

    def plain():
        o = m(q, k, v, a=a, dt=dt)
        o_ref, _ = ref_mamba2(*args64)
        err = rel_err(o, o_ref)
        record("Mamba2 forward", variant="Mamba2", shape=shape, rel_err_o=err, passed=err <= TOL)

    def final_state(initial):
        o, fin = m(q, k, v, a=a, dt=dt, initial_state=initial, output_final_state=True)
        o_ref, fin_ref = ref_mamba2(*args64, state=initial)
        eo, es = rel_err(o, o_ref), rel_err(fin, fin_ref)
        what = "initial and final state" if initial is not None else "final state"
        record(f"Mamba2 forward, {what}", variant="Mamba2", shape=shape, rel_err_o=eo, rel_err_state=es,
               passed=eo <= TOL and es <= TOL)

    def backward(initial):
        # Autograd through the module (q, k, v, a, dt and the initial state)
        # against autograd through the float64 step-by-step reference, with the
        # final state also feeding the loss.
        leaves = [t.clone().requires_grad_() for t in (q, k, v, a, dt)]
        init = initial.clone().requires_grad_() if initial is not None else None
        o, fin = m(*leaves[:3], a=leaves[3], dt=leaves[4], initial_state=init, output_final_state=True)
        do, dfin = torch.randn_like(o), torch.randn_like(fin)
        ins = leaves + ([init] if init is not None else [])
        ours = torch.autograd.grad((o.float() * do.float()).sum() + (fin * dfin).sum(), ins)
        l64 = [t.detach().double().requires_grad_() for t in ins]
        o_ref, fin_ref = ref_mamba2(*l64[:5], state=l64[5] if init is not None else None)
        want = torch.autograd.grad((o_ref * do.double()).sum() + (fin_ref * dfin.double()).sum(), l64)
        names = ["dq", "dk", "dv", "da", "ddt"] + (["d_initial_state"] if init is not None else [])
        errs = {n: rel_err(g, w) for n, g, w in zip(names, ours, want)}
        what = "with an initial state" if init is not None else "from zero"
        record(f"Mamba2 backward, {what}", variant="Mamba2", shape=shape, **{f"rel_err_{n}": e for n, e in errs.items()},
               passed=all(e <= TOL for e in errs.values()))

    guarded("Mamba2 forward", plain, variant="Mamba2", shape=shape)
    guarded("Mamba2 backward, from zero", lambda: backward(None), variant="Mamba2", shape=shape)
    guarded("Mamba2 backward, with an initial state", lambda: backward(state), variant="Mamba2", shape=shape)
    guarded("Mamba2 forward, final state", lambda: final_state(None), variant="Mamba2", shape=shape)
    guarded("Mamba2 forward, initial and final state", lambda: final_state(state), variant="Mamba2", shape=shape)


def check_tensor_maps(lib):
    """The Softmax forward's tensor maps (ArgPlan::TensorMap) hold the
    tensors' addresses: each call must encode them for its own tensors."""
    plan = lib.Softmax.plan("forward")
    maps = [a["tensor_map"]["buffer"] for launch in plan.launch_plans for a in launch["args"] if "tensor_map" in a]
    if not maps:
        record("Softmax tensor maps", arch=lib.arch, note="the Softmax forward takes no tensor maps here", passed=True)
        return
    d = plan.buffers["q"]["shape"][3]
    b, h, s = 2, 4, 300
    shape = f"B={b} H={h} S={s} D={d}"
    # The first call's tensors stay alive, so the second call's (other values)
    # lie at other addresses: PyTorch's allocator would otherwise hand the
    # same memory back and a stale map would read the right tensors.
    kept = []

    def inputs(i):
        torch.manual_seed(1000 + i)
        if i < 2:
            return bf16(b, h, s, d), bf16(b, h, s, d), bf16(b, h, s, d)
        # Contiguous, 16-byte aligned views that start inside larger tensors.
        return tuple(bf16(b + 2, h, s, d)[1:1 + b] for _ in range(3))

    for i, what in enumerate(("fresh tensors", "other tensors of the same shapes", "views into larger tensors")):
        def one(i=i, what=what):
            q, k, v = inputs(i)
            moved = all(t.data_ptr() not in [x.data_ptr() for x in kept] for t in (q, k, v))
            kept.extend((q, k, v))
            o = lib.Softmax(q, k, v)
            torch.cuda.synchronize()
            err = rel_err(o, ref_softmax(q.double(), k.double(), v.double()))
            record(f"Softmax tensor maps, {what}", variant="Softmax", shape=shape, maps=",".join(maps),
                   kernel=lib.Softmax.last_entry, new_addresses=moved, rel_err_o=err, passed=err <= TOL and moved)
        guarded(f"Softmax tensor maps, {what}", one, variant="Softmax", shape=shape)


def check_refusals(lib):
    """Calls the module must refuse, each with a message naming the culprit."""
    B, H, S, D = 2, 4, 200, lib.Softmax.plan("forward").buffers["q"]["shape"][3]
    q, k, v = bf16(B, H, S, D), bf16(B, H, S, D), bf16(B, H, S, D)
    noncontig = torch.randn(B, H, D, S, device=dev).to(torch.bfloat16).transpose(2, 3)
    cases = [
        ("wrong dtype", lambda: lib.Softmax(q.float(), k, v), aec_library.Error, ["q:", "dtype bf16"]),
        ("wrong shape", lambda: lib.Softmax(q, k[:, :, :, : D // 2].contiguous(), v), aec_library.Error,
         ["k: expected [B, H, Skv, %d]" % D, "got [2, 4, 200, %d]" % (D // 2)]),
        ("non-contiguous", lambda: lib.Softmax(q, noncontig, v), aec_library.Error, ["k:", "not contiguous"]),
        ("CPU tensor", lambda: lib.Softmax(q, k, v.cpu()), aec_library.Error, ["v:", "cpu"]),
        ("missing custom input", lambda: lib.RetnetParallel(q, k, v), aec_library.Error, ["RetnetParallel", "gamma"]),
        ("unknown custom input", lambda: lib.Softmax(q, k, v, gamma=torch.ones(H, device=dev)), aec_library.Error,
         ["Softmax", "gamma"]),
    ]

    for what, call, kind, needles in cases:
        def one(what=what, call=call, kind=kind, needles=needles):
            try:
                call()
            except kind as e:
                msg = str(e)
                ok = all(n in msg for n in needles)
                record(f"refuses: {what}", message=msg, passed=ok)
                return
            record(f"refuses: {what}", message="no error raised", passed=False)
        guarded(f"refuses: {what}", one)


# ----------------------------------------------------------------------------
# Speed.


def bench_softmax(lib):
    import triton
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def bench(fn):
        return triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")

    B, H, S, D = 4, 16, 4096, 128
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, S, D, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn(B, H, S, D, device=dev, dtype=torch.bfloat16)
    fwd_flops = 4.0 * B * H * S * S * D
    rows = []
    impls = [("aec (aec_library)", lambda q, k, v: lib.Softmax(q, k, v))]
    for label, backend in (("torch sdpa cuDNN", SDPBackend.CUDNN_ATTENTION), ("torch sdpa flash", SDPBackend.FLASH_ATTENTION)):
        def sdpa(q, k, v, backend=backend):
            with sdpa_kernel([backend]):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=False)
        impls.append((label, sdpa))
    ref = None
    for label, fn in impls:
        row = dict(impl=label, shape=f"B={B} H={H} S={S} D={D} non-causal")
        try:
            with torch.no_grad():
                o = fn(q, k, v)
                ref = o.float() if ref is None else ref
                row["rel_err_vs_aec"] = rel_err(o, ref)
                row["fwd_ms"] = bench(lambda: fn(q, k, v))
            row["fwd_tflops"] = fwd_flops / (row["fwd_ms"] * 1e-3) / 1e12

            def fwd_bwd():
                return torch.autograd.grad(fn(q, k, v), (q, k, v), do)
            row["fwd_bwd_ms"] = bench(fwd_bwd)
            # FlashAttention's count: the backward is 2.5 forwards (5 products against 2).
            row["fwd_bwd_tflops"] = 3.5 * fwd_flops / (row["fwd_bwd_ms"] * 1e-3) / 1e12
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        rows.append(row)
    ours = rows[0]
    for row in rows:
        for p in ("fwd", "fwd_bwd"):
            if f"{p}_ms" in row and f"{p}_ms" in ours:
                row[f"{p}_aec_speedup"] = row[f"{p}_ms"] / ours[f"{p}_ms"]  # > 1: aec is faster
        print("speed " + " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
    return rows


# ----------------------------------------------------------------------------


def main():
    os.makedirs(OUT, exist_ok=True)
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    lib = aec_library.load(LIBDIR)
    print(f"{lib!r} via {aec_library.__file__}", flush=True)
    need = ["Softmax", "Sigmoid", "RetnetParallel", "Mamba2"]
    missing = [n for n in need if n not in lib.variants]
    if missing:
        sys.exit(f"{LIBDIR} lacks {', '.join(missing)}: compile it with the command in this script's docstring")
    d = lib.Softmax.plan("forward").buffers["q"]["shape"][3]
    gamma = lambda h: lambda: 1 - 2.0 ** (-5 - 3 * torch.rand(h, device=dev))  # noqa: E731  per-head decay in (0.97, 0.999)
    for b, h, sq, skv in ((2, 4, 200, 200), (1, 3, 77, 150)):
        check_parallel(lib, "Softmax", ref_softmax, (b, h, h, sq, skv, d), {})
        check_parallel(lib, "Sigmoid", ref_sigmoid, (b, h, h, sq, skv, d), {})
    for b, h, s in ((2, 4, 200), (1, 3, 77)):
        check_parallel(lib, "RetnetParallel", ref_retnet, (b, h, h, s, s, d), {"gamma": gamma(h)})
    if "Decode" in lib.variants:
        for b, h, hkv, skv in ((2, 8, 2, 200), (1, 4, 4, 1000)):
            check_parallel(lib, "Decode", ref_decode, (b, h, hkv, 1, skv, d), {}, kv_splits=(None, 1, 3))
    mb = lib.Mamba2.plan("forward").buffers
    dk, dv = mb["q"]["shape"][3], mb["v"]["shape"][3]
    for b, h, s in ((2, 4, 200), (1, 3, 77)):
        check_mamba2(lib, (b, h, s, dk, dv))
    check_tuning_table(lib, {"Softmax": ref_softmax, "Sigmoid": ref_sigmoid})
    check_tensor_maps(lib)
    check_refusals(lib)
    speed = [] if "--no-bench" in sys.argv else bench_softmax(lib)
    ok = all(c["passed"] for c in checks)
    result = dict(
        device=torch.cuda.get_device_name(), date=started, torch=torch.__version__,
        command=os.environ.get("AEC_COMMAND", "python bench/library_check.py " + " ".join(sys.argv[1:])),
        commit=os.environ.get("AEC_COMMIT", "unknown"), library=os.path.abspath(LIBDIR), module=aec_library.__file__,
        tolerance=TOL, arch=lib.arch, passed=ok, checks=checks, speed=speed,
    )
    with open(os.path.join(OUT, "library_check.json"), "w") as fh:
        json.dump(result, fh, indent=1)
    print(f"{sum(c['passed'] for c in checks)}/{len(checks)} checks passed; wrote {OUT}/library_check.json", flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
