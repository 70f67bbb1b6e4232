"""Sustained power, clocks and energy of forward builds and cuDNN's, on a GPU machine.

    python bench/power_ab.py <workload> <rounds> <cases_dir> [<cases_dir> ...] [--seconds S]

The H200 runs the benchmark's attention forwards at its 700 W power cap
(`nvidia-smi`: throttle reason 0x4, SM clocks 1455-1740 MHz instead of
1980; bench/NOTES.md session 62), so a sustained comparison weighs energy per
launch as much as cycles. Per round, after a second idle, each
implementation (cuDNN's forward for softmax workloads, then each build's, in
an order rotated every round) runs back to back for S seconds (default 3)
while `nvidia-smi` samples the SM clock and the power every 50 ms. Prints per
implementation and round: microseconds per launch (launch gaps included),
the median clock and power of the last two thirds of the samples, energy per
launch (power × time) and SM cycles per launch (time × clock).
"""
import os, statistics, subprocess, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))


def sustained(f, seconds):
    """(µs per launch, median SM clock MHz, median power W) of `f` run back
    to back for `seconds`."""
    import torch
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                            "-lms", "50"], stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(0.2)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        n, t0 = 0, time.time()
        start.record()
        while time.time() - t0 < seconds:
            for _ in range(20):
                f()
            torch.cuda.synchronize()
            n += 20
        end.record()
        torch.cuda.synchronize()
    finally:
        smi.terminate()
    rows = [[float(x) for x in line.split(",")] for line in smi.communicate()[0].splitlines() if line.strip()]
    if len(rows) < 3:
        sys.exit("power_ab: nvidia-smi gave fewer than three samples")
    settled = rows[len(rows) // 3:]
    return (start.elapsed_time(end) * 1e3 / n, statistics.median(r[0] for r in settled),
            statistics.median(r[1] for r in settled))


def main():
    sys.path.insert(0, HERE)
    import ab_rounds
    args = sys.argv[1:]
    seconds = ab_rounds.take_flag(args, "--seconds", 3.0, float, __doc__)
    if not seconds > 0:
        sys.exit(__doc__)
    sys.argv = [sys.argv[0]] + args
    wl_id, rounds, dirs, _ = ab_rounds.command_line(__doc__)
    import torch
    _, _, fns, cudnn = ab_rounds.forward_case("power_ab", wl_id, dirs)
    order = list(dirs)
    if cudnn is not None:
        fns["cudnn"] = cudnn
        order = ["cudnn"] + order
    for f in fns.values():
        f()
    torch.cuda.synchronize()
    for r in range(rounds):
        for name in ab_rounds.rotated(order, r):
            time.sleep(1.0)
            us, clock, power = sustained(fns[name], seconds)
            print(f"{wl_id} round {r} {name:28s} {us:8.1f} us/launch  SM clock {clock:5.0f} MHz  power {power:4.0f} W  "
                  f"energy {power * us * 1e-3:6.1f} mJ/launch  {us * clock / 1e3:8.1f}k cycles/launch", flush=True)


if __name__ == "__main__":
    main()
