"""Block masks built from a mask predicate: aec's builder kernel against
FlexAttention's `create_block_mask`, in one process.

    python bench/block_mask_bench.py <cases_dir>

<cases_dir> is what `aec-bench <cases_dir> --nvrtc --varlen-only` wrote (the
builders of examples/softmax_causal.rs and examples/document_mask.rs). For
each mask at s8192 in 128 × 128 blocks: the builder's time (one launch, the
lists on the device) and Flex's `create_block_mask` (eager and with
`_compile=True`), and whether both give the same blocks (per mask row, the
partial and the full sets). Results go to $OUT/block_mask.json.
"""
import datetime, json, os, random, sys
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_check import OUT, bench, check, ctypes, dev, get_function, libcuda, load_module  # noqa: E402

BLOCK = 128


class Builder:
    """A generated block-mask builder launched through the driver."""

    def __init__(self, cases_dir, meta):
        self.meta = meta
        self.module = load_module(cases_dir, meta["cubin"])
        self.fn = get_function(self.module, meta["name"], 0)

    def __call__(self, customs, b, h, s, outs):
        rows, cols = (s + BLOCK - 1) // BLOCK, (s + BLOCK - 1) // BLOCK
        vals = [ctypes.c_uint64(customs[n].data_ptr()) for n in self.meta["customs"]]
        vals += [ctypes.c_int32(x) for x in (b, h, h, s, s, BLOCK, BLOCK, cols)]
        vals += [ctypes.c_uint64(t.data_ptr()) for t in outs]
        params = (ctypes.c_void_p * len(vals))(*[ctypes.cast(ctypes.byref(x), ctypes.c_void_p) for x in vals])
        grid = (rows, h if self.meta["per_head"] else 1, b if self.meta["per_batch"] else 1)
        stream = torch.cuda.current_stream().cuda_stream
        check(libcuda.cuLaunchKernel(self.fn, *grid, 32, 1, 1, 0, ctypes.c_void_p(stream), params, None),
              "cuLaunchKernel")


def sets(num, idx, at, cols):
    n = int(num.reshape(-1)[at])
    return set(idx.reshape(-1, cols)[at][:n].tolist())


def main():
    cases_dir = sys.argv[1]
    torch.zeros(1, device=dev)
    index = json.load(open(os.path.join(cases_dir, "index.json")))
    from torch.nn.attention.flex_attention import create_block_mask
    rows_out = []
    for meta in index["mask_builders"]:
        ex = meta["example"]
        b, h, s = (1, 32, 8192) if ex == "softmax_causal" else (2, 32, 8192)
        customs = {}
        if ex == "softmax_causal":
            def mask_mod(bb, hh, qi, ki):
                return qi >= ki
        else:
            # Documents of 64–2048 rows; queries and keys share them.
            rng = random.Random(7)
            docs = []
            for _ in range(b):
                ids, d = [], 0
                while len(ids) < s:
                    ids += [d] * rng.randint(64, 2048)
                    d += 1
                docs.append(ids[:s])
            doc = torch.tensor(docs, device=dev, dtype=torch.float32)
            customs = {"doc_q": doc.contiguous(), "doc_k": doc.contiguous()}

            def mask_mod(bb, hh, qi, ki):
                return (doc[bb, qi] == doc[bb, ki]) & (qi >= ki)
        builder = Builder(cases_dir, meta)
        rows = cols = (s + BLOCK - 1) // BLOCK
        planes = (b if meta["per_batch"] else 1) * (h if meta["per_head"] else 1)
        outs = [torch.zeros(planes * rows, device=dev, dtype=torch.int32),
                torch.zeros(planes * rows * cols, device=dev, dtype=torch.int32),
                torch.zeros(planes * rows, device=dev, dtype=torch.int32),
                torch.zeros(planes * rows * cols, device=dev, dtype=torch.int32)]
        builder(customs, b, h, s, outs)
        torch.cuda.synchronize()
        ours_ms = bench(lambda: builder(customs, b, h, s, outs))
        mb = b if meta["per_batch"] else None
        flex = create_block_mask(mask_mod, mb, None, s, s, device=dev, BLOCK_SIZE=BLOCK)
        flex_ms = bench(lambda: create_block_mask(mask_mod, mb, None, s, s, device=dev, BLOCK_SIZE=BLOCK))
        try:
            create_block_mask(mask_mod, mb, None, s, s, device=dev, BLOCK_SIZE=BLOCK, _compile=True)
            flexc_ms = bench(lambda: create_block_mask(mask_mod, mb, None, s, s, device=dev, BLOCK_SIZE=BLOCK,
                                                       _compile=True))
        except Exception as e:  # noqa: BLE001
            flexc_ms = None
            print("create_block_mask(_compile=True) failed:", type(e).__name__, e)
        # Same blocks? (Flex lists per [B or 1, 1, rows]; ours per plane.)
        same = True
        for at in range(planes * rows):
            fa = at  # both are [planes, rows] with planes = batches here (heads shared)
            for (n1, i1, n2, i2) in ((outs[0], outs[1], flex.kv_num_blocks, flex.kv_indices),
                                     (outs[2], outs[3], flex.full_kv_num_blocks, flex.full_kv_indices)):
                if sets(n1, i1, at, cols) != sets(n2, i2, fa, i2.shape[-1]):
                    same = False
        listed = int(outs[0].sum() + outs[2].sum())
        row = dict(mask=ex, b=b, h=h, s=s, block=BLOCK, planes=planes, listed=listed, of=planes * rows * cols,
                   aec_ms=ours_ms, flex_ms=flex_ms, flex_compiled_ms=flexc_ms, same_blocks=same)
        print(json.dumps(row), flush=True)
        rows_out.append(row)
    json.dump(dict(device=torch.cuda.get_device_name(), date=str(datetime.date.today()), torch=torch.__version__,
                   command="python bench/block_mask_bench.py bench/cases", rows=rows_out),
              open(os.path.join(OUT, "block_mask.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
