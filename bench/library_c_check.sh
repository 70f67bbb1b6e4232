#!/usr/bin/env bash
# The C interface of a kernel library on a GPU machine (gcc, python3 with
# PyTorch, the NVIDIA driver; no Rust toolchain needed). From the repository
# root:
#
#   bench/library_c_check.sh LIBDIR [LIBDIR2 ...]
#
# Each LIBDIR is a library with its C headers (include/aec_library.h and
# aec_loader.h, written by aec compile), e.g.
#   aec compile examples/softmax.rs --target h100 --head-dims 128 -o LIBDIR
# The first must have the Softmax forward; a library with the Decode forward
# (examples/decode.rs) gets the split-KV cases too; every library gets the
# API check, whose sections run for the variants it has (Softmax, Alibi,
# Decode, Mamba2).
#
# 1. Builds tests/c/forward_check.c and tests/c/api_check.c against each
#    LIBDIR/include with gcc -std=c99 -pedantic and g++ -std=c++17, -Wall
#    -Wextra -Werror.
# 2. Writes random bf16 q, k, v and a float64 PyTorch reference of softmax
#    attention (o = softmax(q k^T / sqrt(Dqk)) v, GQA for Decode, and the
#    row outputs lse, m, l in the plan's order) for B=2,H=4,Sq=200,Skv=333
#    and two more shapes (Decode: three shapes with Sq = 1, split KV or
#    not), and runs forward_check on each: error max|o - ref| / max|ref|
#    below TOL (default 2e-2), plus its error-path checks on the GPU.
# 3. Runs api_check on every LIBDIR (errors before launch, real calls
#    against invariants, workspaces, KV splits).
# Writes $OUT/library_c_check.json (device, date, command, cases, errors)
# and $OUT/library_c_check.log (every build and run with its output);
# exits nonzero when anything failed.
set -u
OUT=${OUT:-/tmp/aec-out}
TOL=${TOL:-2e-2}
mkdir -p "$OUT"
if [ $# -lt 1 ]; then
  echo "usage: $0 LIBDIR [LIBDIR2 ...]" >&2
  exit 2
fi
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
status=0
LOG="$OUT/library_c_check.log"
: >"$LOG"
builds="$WORK/builds.txt"
: >"$builds"
i=0
for lib in "$@"; do
  i=$((i + 1))
  for prog in api_check forward_check; do
    for lang in c cpp; do
      if [ "$lang" = c ]; then cc=(gcc -std=c99 -pedantic); else cc=(g++ -std=c++17 -x c++); fi
      exe="$WORK/${prog}_${lang}_$i"
      echo "\$ ${cc[*]} -Wall -Wextra -Werror -O2 -I $lib/include tests/c/$prog.c -o $exe -ldl -lm" >>"$LOG"
      if "${cc[@]}" -Wall -Wextra -Werror -O2 -I "$lib/include" "tests/c/$prog.c" -o "$exe" -ldl -lm \
        >"$WORK/build.log" 2>&1; then
        echo "$lib $prog $lang $exe ok" >>"$builds"
      else
        echo "build of $prog ($lang) against $lib/include failed:"
        cat "$WORK/build.log"
        echo "$lib $prog $lang $exe failed" >>"$builds"
        status=1
      fi
      cat "$WORK/build.log" >>"$LOG"
    done
  done
done

python3 - "$WORK" "$OUT" "$TOL" "$builds" "$0 $*" "$@" <<'EOF' || status=1
import datetime, json, math, os, subprocess, sys

work, out, tol, builds_file, command, libdirs = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6:]
errors, cases, api = [], [], []
builds = [line.split() for line in open(builds_file) if line.strip()]

def exe(lib, prog, lang):
    for b in builds:
        if b[0] == lib and b[1] == prog and b[2] == lang and b[4] == "ok":
            return b[3]
    return None

try:
    import torch
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device visible to torch"
except Exception as e:  # the C programs do not need torch; the reference does
    torch, device = None, f"torch unavailable: {e}"
try:
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=60).stdout.strip()
except Exception:
    smi = ""

def run(cmd, what):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    with open(os.path.join(out, "library_c_check.log"), "a") as f:
        f.write(f"==== {what}: exit {p.returncode}\n$ " + " ".join(cmd) + "\n" + p.stdout + "--- stderr\n" + p.stderr + "\n")
    return p

def expected_kernel(lib, name, sizes):
    """The forward kernel the loaders' rule picks for `sizes` on this GPU
    (the library's own Python module says): a tuning-table kernel whose
    bucket holds them, else the default."""
    sys.path.insert(0, os.path.join(lib, "python"))
    import aec_library
    sys.path.pop(0)
    manifest = aec_library.read_manifest(lib)
    arch = aec_library.arch_for_capability(torch.cuda.get_device_capability(0))
    v = next(v for v in manifest["variants"] if v["name"] == name)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    tuned = aec_library.select_tuned(v, "forward", arch, device, sizes, sms)
    record = tuned[0] if tuned else aec_library.select_kernel(v, "forward", arch)[0]
    return record["entry"]

def forward_record(lib, name):
    """The first forward record of variant `name` in lib's manifest, or None."""
    manifest = json.load(open(os.path.join(lib, "manifest.json")))
    for v in manifest["variants"]:
        if v["name"] == name:
            return next((k for k in v["kernels"] if k.get("pass") == "forward" and "plan" in k), None)
    return None

# (variant, C name, shapes (B, H, Hkv, Sq, Skv))
checks = [("Softmax", "softmax", [(2, 4, 4, 200, 333), (1, 8, 8, 1, 1000), (3, 2, 2, 517, 64)]),
          ("Decode", "decode", [(2, 8, 2, 1, 4099), (1, 32, 8, 1, 777), (16, 16, 4, 1, 128)])]
n = 0
for li, lib in enumerate(libdirs):
    for name, cname, shapes in checks:
        try:
            rec = forward_record(lib, name)
        except Exception as e:
            errors.append(f"{lib}/manifest.json: {e}")
            break
        if rec is None:
            if li == 0 and name == "Softmax":
                errors.append(f"{lib}: no Softmax forward record in manifest.json (the first LIBDIR must have one)")
            continue
        if torch is None:
            note = "PyTorch is not importable: no reference, forward_check not run"
            if note not in errors:
                errors.append(note)
            continue
        dqk, dv = rec["head_dims"]["Dqk"], rec["head_dims"]["Dv"]
        names = rec.get("row_outputs", [])
        for (B, H, Hkv, Sq, Skv) in shapes:
            n += 1
            case = dict(libdir=lib, variant=name, B=B, H=H, Hkv=Hkv, Sq=Sq, Skv=Skv, Dqk=dqk, Dv=dv)
            g = torch.Generator().manual_seed(1234 + n)
            q = torch.randn(B, H, Sq, dqk, generator=g).to(torch.bfloat16)
            k = torch.randn(B, Hkv, Skv, dqk, generator=g).to(torch.bfloat16)
            v = torch.randn(B, Hkv, Skv, dv, generator=g).to(torch.bfloat16)
            kr = k.double().repeat_interleave(H // Hkv, dim=1)
            vr = v.double().repeat_interleave(H // Hkv, dim=1)
            s = (q.double() @ kr.transpose(-1, -2)) / math.sqrt(dqk)
            m = s.amax(-1)
            p = torch.exp(s - m[..., None])
            l = p.sum(-1)
            o = (p @ vr) / l[..., None]
            rows = {"scale.lse": m + torch.log(l), "state.m": m, "state.l": l}
            files = {}
            for fname, t in [("q", q), ("k", k), ("v", v)]:
                files[fname] = os.path.join(work, f"case{n}.{fname}.bin")
                t.contiguous().view(torch.int16).numpy().tofile(files[fname])
            files["o"] = os.path.join(work, f"case{n}.o_ref.bin")
            o.float().contiguous().numpy().tofile(files["o"])
            if names and all(x in rows for x in names):
                files["rows"] = os.path.join(work, f"case{n}.rows_ref.bin")
                torch.stack([rows[x] for x in names]).float().contiguous().numpy().tofile(files["rows"])
            else:
                files["rows"] = "-"
                case["rows_note"] = f"row outputs {names} not all known to this script: not compared"
            for lang in ("c", "cpp"):
                prog = exe(lib, "forward_check", lang)
                if prog is None:
                    errors.append(f"forward_check ({lang}) against {lib} did not build")
                    continue
                cmd = [prog, lib, f"{cname}.forward", str(B), str(H), str(Hkv), str(Sq), str(Skv), str(dqk), str(dv),
                       files["q"], files["k"], files["v"], files["o"], files["rows"], str(tol)]
                p = run(cmd, f"forward_check {lang} case {n}")
                result = next((line for line in p.stdout.splitlines() if line.startswith("RESULT")), None)
                errs = {}
                if result:
                    for kv in result.split()[1:]:
                        key, _, val = kv.partition("=")
                        try:
                            errs[key] = float(val)
                        except ValueError:
                            errs[key] = val
                want = expected_kernel(lib, name, dict(B=B, H=H, Hkv=Hkv, Sq=Sq, Skv=Skv))
                ran = errs.get("kernel")
                row = dict(case, lang=lang, exit=p.returncode, passed=p.returncode == 0 and ran == want, errors=errs,
                           kernel=ran, expected_kernel=want,
                           failures=[x for x in p.stderr.splitlines() if x.startswith("FAIL")])
                if p.returncode == 0 and ran != want:
                    errors.append(f"forward_check {lang} {case}: ran {ran}, but the tuning-table rule picks {want}")
                cases.append(row)
                print(f"forward_check {lang} {name} B={B} H={H} Hkv={Hkv} Sq={Sq} Skv={Skv}: "
                      f"{'PASS' if p.returncode == 0 else 'FAIL'} exit={p.returncode} {result or p.stderr.strip()[-300:]}",
                      flush=True)
                if p.returncode != 0:
                    errors.append(f"forward_check {lang} {case}: exit {p.returncode}: {p.stderr.strip()[-500:]}")

for i, lib in enumerate(libdirs):
    for lang in ("c", "cpp"):
        prog = exe(lib, "api_check", lang)
        if prog is None:
            errors.append(f"api_check ({lang}) against {lib} did not build")
            continue
        p = run([prog, lib], f"api_check {lang} {lib}")
        fails = [x for x in p.stderr.splitlines() if x.startswith("FAIL")]
        sections = [x[len("section "):] for x in p.stdout.splitlines() if x.startswith("section ")]
        api.append(dict(libdir=lib, lang=lang, exit=p.returncode, passed=p.returncode == 0,
                        sections=sorted(set(sections)), failures=fails,
                        checks_ok=sum(1 for x in p.stdout.splitlines() if x.startswith("ok "))))
        print(f"api_check {lang} {lib}: {'PASS' if p.returncode == 0 else 'FAIL'} exit={p.returncode} "
              f"sections={sorted(set(sections))}", flush=True)
        for x in fails:
            print("  " + x)
        if p.returncode != 0:
            errors.append(f"api_check {lang} {lib}: exit {p.returncode}: {'; '.join(fails) or p.stderr.strip()[-500:]}")

for b in builds:
    if b[4] != "ok":
        errors.append(f"build of {b[1]} ({b[2]}) against {b[0]}/include failed (see library_c_check.log)")

passed = not errors and bool(cases) and all(c["passed"] for c in cases)
report = dict(device=device, nvidia_smi=smi, date=datetime.datetime.now(datetime.timezone.utc).isoformat(),
              command=command, tolerance=tol, error_measure="max |got - ref| / max |ref| per tensor",
              forward_cases=cases, api_checks=api, errors=errors, passed=passed)
with open(os.path.join(out, "library_c_check.json"), "w") as f:
    json.dump(report, f, indent=2)
print(f"wrote {os.path.join(out, 'library_c_check.json')}: {'PASS' if passed else 'FAIL'}"
      + "".join(f"\n  error: {e}" for e in errors))
sys.exit(0 if passed else 1)
EOF
exit $status
