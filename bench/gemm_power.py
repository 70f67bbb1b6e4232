"""A bf16 matrix product sustained at the power cap: the tensor cores' ceiling as the GPU runs it.

    python bench/gemm_power.py [N] [--rounds R] [--seconds S] [--flop F]

Runs torch.matmul of two random N × N bf16 matrices (default 8192) back to
back for S seconds (default 3) per round, while `nvidia-smi` samples the SM
clock and power (power_ab.sustained), and prints TFLOP/s, clock, power and
energy per GFLOP. With `--flop F` (an attention forward's executed FLOP, e.g.
DeepSeek 192/128 causal b8 h16 s2048 on 128 × 128 tiles: 1.825e11) it also
prints the time that work would take at the product's sustained rate: a
floor for any kernel that does that work on the tensor cores at the cap,
the normalisation, the masking and every byte moved free.
"""
import os, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    sys.path.insert(0, HERE)
    from ab_rounds import take_flag
    args = sys.argv[1:]
    rounds = take_flag(args, "--rounds", 2, int, __doc__)
    seconds = take_flag(args, "--seconds", 3.0, float, __doc__)
    work = take_flag(args, "--flop", None, float, __doc__)
    if len(args) > 1 or rounds < 1 or not seconds > 0:
        sys.exit(__doc__)
    n = int(args[0]) if args else 8192
    import torch
    from power_ab import sustained
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)

    def product():
        torch.matmul(a, b, out=c)

    product()
    torch.cuda.synchronize()
    flop = 2.0 * n ** 3
    for r in range(rounds):
        time.sleep(1.0)
        us, clock, power = sustained(product, seconds)
        rate = flop / (us * 1e-6) / 1e12
        line = (f"gemm {n}^3 round {r}: {us:8.1f} us/product  {rate:6.1f} TFLOP/s  SM clock {clock:5.0f} MHz  "
                f"power {power:4.0f} W  {power / rate:5.3f} mJ/GFLOP")
        if work is not None:
            line += f"  {work:.4g} FLOP at this rate: {work / (rate * 1e12) * 1e6:6.1f} us"
        print(line, flush=True)


if __name__ == "__main__":
    main()
