"""Per-block timeline of a benchmark forward kernel, on a GPU machine.

    python bench/timeline.py <cases_dir> <workload>[,<workload>...] [--launches N] [--tile TAG] [--tiles]

<cases_dir> comes from `aec-bench <cases_dir> --nvrtc --timeline` (add
`--workloads ...` for a quick build): each benchmark forward is also built
with -DAEC_TIMELINE, where thread 0 of every block records %globaltimer at
the template's marks (templates/cuda/prelude.cu; the forward's marks:
0 start, 6 first K/V block landed, 1 after the key loop, 2 after the
key-warp merge, 3 after the epilogue, 4 after a split's arrival, 5 end;
the warp-specialised path marks 0, 6, 1, 3 and 5). `--tile TAG` takes the
kernel of one of the workload's timed tiles instead of its default (built
with aec-bench's `--timeline-tiles TAG,...`). The kernel runs N times
(default 6) on three rotating input
sets (more than L2 holds for decoding); the last launch's marks are
printed as quantiles over the blocks (microseconds from the first block's
start) and as the time between consecutive marks, and written with every
block's raw marks to $OUT/timeline.json. Variants with custom inputs are
refused. The marks cost a few registers and stores: compare timelines
with each other, and times with gpu_check.py.

`--tiles` adds the warp-specialised forward's per-tile marks (persistent
kernels walk many tiles per block; templates/cuda/parallel_fwd.cu lists
the slots): the fit of a tile's period (from its Q landing to the next
tile's) against its key blocks, `period = fixed + per_block * n`, and the
median of each phase of a tile's first block, as in bench/NOTES.md
session 58; timeline.json keeps every tile's raw slots (`tiles.raw`).
"""
import ctypes, json, os, sys
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
MARKS = ["start", "loop end", "key-warp merge", "epilogue", "arrival", "end", "first K/V"]
# The order the marks come in (slot 6 was added last).
ORDER = [0, 6, 1, 2, 3, 4, 5]
BLOCKS = 65536  # AEC_TIMELINE_BLOCKS in templates/cuda/prelude.cu
TILE_BLOCKS, TILE_SLOTS = 1024, 64  # AEC_TILE_BLOCKS, AEC_TILE_SLOTS there
TILE_PHASES = ["Q -> first K/V", "first K/V -> first S GEMM", "first S GEMM -> first block done",
               "first block done -> loop end", "loop end -> next Q"]


def tile_report(g, kern, blocks, launch):
    """The per-tile marks of the last launch (`launch()` runs it after the
    marks are cleared): the period fit and the first block's phases."""
    import statistics
    ptr, size = ctypes.c_uint64(0), ctypes.c_size_t(0)
    g.check(g.libcuda.cuModuleGetGlobal_v2(ctypes.byref(ptr), ctypes.byref(size), kern.module, b"aec_tile_timeline"),
            "cuModuleGetGlobal aec_tile_timeline (a warp-specialised forward's timeline build)")
    buf = (ctypes.c_uint64 * (size.value // 8))()
    g.check(g.libcuda.cuMemcpyHtoD_v2(ptr.value, buf, ctypes.sizeof(buf)), "clear tile marks")
    launch()
    g.check(g.libcuda.cuMemcpyDtoH_v2(buf, ptr.value, ctypes.sizeof(buf)), "read tile marks")
    tiles = []  # per block: [q, k, s, first, loop_end, n_iter]
    for blk in range(min(blocks, TILE_BLOCKS)):
        row = []
        for t in range(TILE_SLOTS):
            m = buf[(blk * TILE_SLOTS + t) * 8:(blk * TILE_SLOTS + t) * 8 + 8]
            if not m[0]:
                break
            row.append(m)
        tiles.append(row)
    xs, ys, phases = [], [], []
    for row in tiles:
        for a, b in zip(row, row[1:]):
            xs.append(a[5])
            ys.append((b[0] - a[0]) / 1e3)
            if all(a[k] for k in range(5)):
                phases.append([(a[k + 1] - a[k]) / 1e3 for k in range(4)] + [(b[0] - a[4]) / 1e3])
    if len(set(xs)) < 2:
        print("  tiles: too few tiles of different lengths for a fit")
        return {}
    mx, my = statistics.mean(xs), statistics.mean(ys)
    per = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    fixed = my - per * mx
    print(f"  tiles: {len(xs) + len(tiles)} on {len(tiles)} blocks; period = {fixed:.2f} + {per:.3f} * key blocks (us)")
    # The raw marks too (per block, per tile: the eight slots as recorded,
    # %globaltimer ns or values), for analyses the summary does not make.
    out = dict(fixed_us=fixed, per_block_us=per, phases_us={}, raw=[[list(m) for m in row] for row in tiles])
    for name, col in zip(TILE_PHASES, zip(*phases)):
        med = statistics.median(col)
        out["phases_us"][name] = med
        print(f"  tile phase {name:34s} median {med:7.2f} us")
    return out


def quantiles(xs):
    xs = sorted(xs)
    return [xs[int(p * (len(xs) - 1))] for p in (0.0, 0.1, 0.5, 0.9, 1.0)]


def main():
    args = sys.argv[1:]
    if len(args) < 2 or args[0].startswith("-"):
        sys.exit(__doc__)
    cases_dir, wanted = args[0], args[1].split(",")
    launches = int(args[args.index("--launches") + 1]) if "--launches" in args else 6
    per_tile = "--tiles" in args
    tile = args[args.index("--tile") + 1] if "--tile" in args else None
    if launches < 1:
        sys.exit(f"timeline: --launches must be at least 1, not {launches}")
    # gpu_check reads its own command line at import (--rounds, ...).
    sys.argv = [sys.argv[0], cases_dir]
    import gpu_check as g
    torch.zeros(1, device="cuda")  # PyTorch's context, which our modules load into
    index = json.load(open(os.path.join(cases_dir, "index.json")))
    by_id = g.workloads_by_id(cases_dir, index)
    entries = {e["workload"]: e for e in index["bench"]}
    g.libcuda.cuModuleGetGlobal_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t),
                                               ctypes.c_void_p, ctypes.c_char_p]
    g.libcuda.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]
    g.libcuda.cuMemcpyHtoD_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t]
    report = []
    for wl in wanted:
        if wl not in entries or wl not in by_id:
            sys.exit(f"timeline: no benchmark workload `{wl}` in {cases_dir} (have: {', '.join(entries)})")
        meta = entries[wl].get("kernel") or {}
        if tile is not None:
            tiles = {t["tiles"]: t.get("kernel") or {} for t in entries[wl].get("tiles", [])}
            if tile not in tiles:
                sys.exit(f"timeline: `{wl}` has no tile `{tile}` in {cases_dir} (have: {', '.join(tiles)})")
            meta = tiles[tile]
        if not meta.get("timeline_cubin"):
            sys.exit(f"timeline: `{wl}`{f' tile `{tile}`' if tile else ''} has no timeline build in {cases_dir}: "
                     f"run aec-bench with --timeline{' --timeline-tiles ' + tile if tile else ''}")
        if any(a["kind"] == "custom" for a in meta["args"]):
            sys.exit(f"timeline: `{wl}`'s variant takes custom inputs, which this tool does not make")
        w = by_id[wl]
        b, h, hkv, sq, skv, dqk, dv = w["b"], w["h"], w["hkv"], w["sq"], w["skv"], w["dqk"], w["dv"]
        kern = g.Kernel(cases_dir, dict(meta, cubin=meta["timeline_cubin"]))
        ptr, size = ctypes.c_uint64(0), ctypes.c_size_t(0)
        g.check(g.libcuda.cuModuleGetGlobal_v2(ctypes.byref(ptr), ctypes.byref(size), kern.module, b"aec_timeline"),
                "cuModuleGetGlobal aec_timeline")

        def inputs():
            q = torch.randn(b, h, sq, dqk, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(b, hkv, skv, dqk, device="cuda", dtype=torch.bfloat16)
            # V stored in K (the latent cache): the kernel reads V from k's rows.
            v = k if w.get("v_in_k") else torch.randn(b, hkv, skv, dv, device="cuda", dtype=torch.bfloat16)
            return q, k, v
        sets = [inputs() for _ in range(3)]
        sizes = dict(B=b, H=h, Hkv=hkv, Sq=sq, Skv=skv)
        buf = (ctypes.c_uint64 * (BLOCKS * 8))()
        for n in range(launches):
            if n == launches - 1:
                # Marks a block does not reach stay 0 (buf is zeroed).
                g.check(g.libcuda.cuMemcpyHtoD_v2(ptr.value, buf, ctypes.sizeof(buf)), "clear marks")
            kern(*sets[n % 3], {}, sizes)
            torch.cuda.synchronize()
        g.check(g.libcuda.cuMemcpyDtoH_v2(buf, ptr.value, ctypes.sizeof(buf)), "read marks")
        x, y, z = kern.launch_grid(sizes, kern.last_splits)
        blocks = min(x * y * z, BLOCKS)
        rows = [[buf[i * 8 + m] for m in range(8)] for i in range(blocks)]
        t0 = min(r[0] for r in rows)
        reached = [m for m in ORDER if all(r[m] for r in rows)]
        print(f"{wl}: `{meta['name']}`, {blocks} blocks, {kern.last_splits} KV splits, launch {launches} of {launches};"
              f" us, quantiles over blocks: min p10 p50 p90 max")
        out = dict(workload=wl, kernel=meta["name"], blocks=blocks, kv_splits=kern.last_splits, marks={}, phases={})
        for m in reached:
            qs = quantiles([(r[m] - t0) / 1e3 for r in rows])
            out["marks"][MARKS[m]] = qs
            print(f"  at {MARKS[m]:15s}" + "".join(f"{v:8.2f}" for v in qs))
        for a, c in zip(reached, reached[1:]):
            qs = quantiles([(r[c] - r[a]) / 1e3 for r in rows])
            out["phases"][f"{MARKS[a]} -> {MARKS[c]}"] = qs
            print(f"  {MARKS[a] + ' -> ' + MARKS[c]:31s}" + "".join(f"{v:8.2f}" for v in qs))
        if per_tile:
            def launch():
                kern(*sets[0], {}, sizes)
                torch.cuda.synchronize()
            out["tiles"] = tile_report(g, kern, blocks, launch)
        out["raw_ns"] = [[r[m] - t0 if r[m] else None for m in reached] + [r[7]] for r in rows]
        out["raw_columns"] = [MARKS[m] for m in reached] + ["sm"]
        report.append(out)
        del sets
        torch.cuda.empty_cache()
    dest = os.environ.get("OUT", ".")
    with open(os.path.join(dest, "timeline.json"), "w") as f:
        json.dump(report, f)
    print(f"wrote {os.path.join(dest, 'timeline.json')}")


if __name__ == "__main__":
    main()
