"""A/B of forward builds in rotated rounds, on a GPU machine.

    python bench/fwd_ab.py <workload> <rounds> <cases_dir> [<cases_dir> ...] [--no-check]

Each <cases_dir> comes from `aec-bench <cases_dir> --nvrtc --workloads
<workload>` on a different build (copy shared/reference/workloads.json into
it). On the same random inputs each build's forward runs once and its output
is compared with cuDNN's (SDPA's cuDNN backend; for variants other than
softmax, with the first build's), the output filled with NaN first, and
again after the rounds; in between, per round, cuDNN's forward and each
build's are timed (median of do_bench), the builds in an order rotated every
round, so that builds a few percent apart are compared within one process.
Prints per implementation the median over rounds, its TFLOP/s and every
round. `--no-check` times builds whose outputs disagree (timing-only
ablations) instead of stopping.
"""
import os, sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    sys.path.insert(0, HERE)
    import ab_rounds
    wl_id, rounds, dirs, check = ab_rounds.command_line(__doc__)
    g, w, runs, cudnn = ab_rounds.forward_case("fwd_ab", wl_id, dirs)
    anchor = cudnn is not None
    if anchor:
        ref = cudnn().float()
        against = "cuDNN"
    else:
        ref = runs[dirs[0]]()[0].float().clone()
        against = dirs[0]

    def compare(when):
        for d, run in runs.items():
            got = run(o_fill=float("nan"))[0]
            err = g.rel_err(got.float(), ref)
            print(f"{d}: rel. error against {against}{when} {err:.2e}", flush=True)
            if check and not err < 2e-2:
                sys.exit(f"fwd_ab: {d} disagrees with {against}{when}")

    compare("")

    timed = ab_rounds.timed
    times = {"cudnn": []} if anchor else {}
    for d in dirs:
        times[d] = []
    for r in range(rounds):
        if anchor:
            times["cudnn"].append(timed(cudnn))
        for d in ab_rounds.rotated(dirs, r):
            times[d].append(timed(runs[d]))
    # Again after the rounds: kernels that keep state between launches (a
    # ticket counter each launch leaves at zero) must still be right.
    compare(" after the rounds")
    fl = g.flops_fwd(w)
    ab_rounds.report(wl_id, times, "cudnn" if anchor else dirs[0], "cudnn" if anchor else "first", fl)


if __name__ == "__main__":
    main()
