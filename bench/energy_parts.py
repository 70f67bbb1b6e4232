"""Timing-only ablations of a generated sm_90a forward, to split its energy per launch by part.

    python bench/energy_parts.py <cases_dir> <workload> <out_dir> --nvcc NVCC [--include DIR]

On the H200 the forwards run at the 700 W power cap, so a launch's time
follows its energy (bench/NOTES.md sessions 62 and 63). This writes, per
part, <out_dir>/e_<part>/ with <cases_dir>'s index and workloads, the
workload's generated forward source with that part removed, and its cubin:

  noexp      the exponentials (`ex2.approx` becomes a copy)
  nopv       P·V's k-steps but the first
  halfs      the second half of S's k-steps
  norescale  O's rescale after each block's online step
  noload     the producer's K/V copies after the CTA's first STAGES blocks
             (their barriers still complete; the consumers read stale tiles)
  nonorm     the whole online normalisation: P is S as it comes (masked
             scores clamped), the state never moves, O is never rescaled —
             what the kernel's GEMMs and data movement cost on their own

Each output is wrong by construction. Time them beside the unpatched build:
`python bench/power_ab.py <workload> <rounds> <cases_dir> <out_dir>/e_* --seconds 3`;
the difference in energy per launch is what that part costs. Exits naming
the part whose code the source lacks (another template, or a template that
changed: the patterns below follow templates/cuda/parallel_fwd.cu).
"""
import json, os, re, shutil, subprocess, sys

# An online-step function of the generated source (its signature kept as
# group 1, its body matched whole), and the end `nonorm` gives it: the state
# as it came, alpha 1.
ONLINE_STEP = r"(__device__ __forceinline__ void {}\(.*?const Params& P\) \{{\n).*?\n\}}\n"
STATE_UNMOVED = r"#pragma unroll\n    for (int f = 0; f < NSTATE_ARR; ++f) nst[f] = st[f];\n    alpha = 1.0f;\n}\n"

# (part, [(pattern, replacement, required)]).
PARTS = [
    ("noexp", [(r'asm\("ex2\.approx\.ftz\.f32 %0, %1;" : "=f"\(y\) : "f"\(x\)\);', "y = x;", True)]),
    ("nopv", [(r"(for \(int kk = 0; kk < )BN / 16(; \+\+kk\)\s*wgmma_rs_n\d+\(acc)", r"\g<1>1\g<2>", True)]),
    ("halfs", [(r"(for \(int kk = 0; kk < )DQK / 16(; \+\+kk\)\s*wgmma_(?:ss|rsk)_n\d+\(s\[0\])",
                r"\g<1>DQK / 32\g<2>", True)]),
    ("norescale", [(r"\n\s*acc\[0\]\[dt\]\[[0-3]\] \*= alpha\[[01]\];", "", True)]),
    # The online step's two forms (a full block's and a masked block's) with
    # their bodies replaced; alpha = 1 lets the compiler drop O's rescale.
    ("nonorm", [
        (ONLINE_STEP.format("online_fwd"),
         r"\g<1>    any = true;\n#pragma unroll\n    for (int e = 0; e < NE; ++e) p[e] = valid[e] ? s[e] : 0.0f;\n"
         + STATE_UNMOVED, True),
        (ONLINE_STEP.format("online_fwd_neg_inf"),
         r"\g<1>#pragma unroll\n    for (int e = 0; e < NE; ++e) p[e] = fmaxf(s[e], -1.0e4f);\n" + STATE_UNMOVED, False),
    ]),
    # K (or K and V on one barrier), then V where it has barriers of its own.
    ("noload", [
        (r"if \(ptid == 0\) \{(\s*mbar_arrive_expect_tx\(smem_at\(bar_full, st\), BN \* )",
         r"if (ptid == 0 && gi >= STAGES) mbar_arrive(smem_at(bar_full, st)); else if (ptid == 0) {\g<1>", True),
        (r"if \(ptid == 0\) \{(\s*\\\s*mbar_arrive_expect_tx\(smem_at\(bar_full_v, sv\))",
         r"if (ptid == 0 && (gv) >= STAGES) mbar_arrive(smem_at(bar_full_v, sv)); else if (ptid == 0) {\g<1>", False),
    ]),
]


def main():
    args = sys.argv[1:]
    opts = {}
    for flag in ("--nvcc", "--include"):
        if flag in args:
            i = args.index(flag)
            if i + 1 >= len(args):
                sys.exit(__doc__)
            opts[flag] = args[i + 1]
            del args[i:i + 2]
    if len(args) != 3 or "--nvcc" not in opts:
        sys.exit(__doc__)
    cases, wl_id, out = args
    index = json.load(open(os.path.join(cases, "index.json")))
    entry = {e["workload"]: e for e in index["bench"]}.get(wl_id)
    if entry is None or "kernel" not in entry:
        sys.exit(f"energy_parts: no forward kernel for `{wl_id}` in {cases}")
    name = "bench_" + re.sub(r"[^0-9a-zA-Z]", "_", wl_id)
    path = os.path.join(cases, name + ".cu")
    if not os.path.exists(path):
        sys.exit(f"energy_parts: {path} is missing (aec-bench writes it beside index.json)")
    source = open(path).read()
    for part, subs in PARTS:
        patched = source
        for pattern, replacement, required in subs:
            patched, n = re.subn(pattern, replacement, patched, flags=re.S)
            if n == 0 and required:
                sys.exit(f"energy_parts: {part}: `{pattern}` is not in {name}.cu")
        d = os.path.join(out, "e_" + part)
        os.makedirs(d, exist_ok=True)
        for f in ("index.json", "workloads.json"):
            shutil.copy(os.path.join(cases, f), d)
        cu = os.path.join(d, name + ".cu")
        open(cu, "w").write(patched)
        cmd = [opts["--nvcc"], "-arch=sm_90a", "-cubin", "-O3", "-diag-suppress", "177,550",
               "-o", os.path.join(d, name + ".sm_90a.cubin"), cu]
        if "--include" in opts:
            cmd += ["-I", opts["--include"]]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"energy_parts: {part}: nvcc failed:\n{r.stderr}")
        print(f"energy_parts: {d}", flush=True)


if __name__ == "__main__":
    main()
