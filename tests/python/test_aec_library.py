"""Unit tests of aec_library's plan interpreter: no PyTorch, no GPU.

    AEC_TEST_LIBRARY=DIR python3 -m unittest tests/python/test_aec_library.py

DIR is a library `aec compile` wrote from examples/alibi.rs, decode.rs and
mamba2.rs (`--head-dims 128x64 --target h100,a100`; cubins not needed;
other variants may be there too):
`cargo test --test library_python` makes one and runs this file. The module
tested is DIR/python/aec_library.py where the library has one, else
templates/library/aec_library.py. AEC_TEST_MANIFEST=path/manifest.json
reads the plans from that file instead. Without either, only the tests that
need no manifest run.

    AEC_TEST_HIP_LIBRARY=DIR AEC_TEST_FAKE_HIP=.../libamdhip64.so \
        AEC_FAKE_HIP_LOG=FILE python3 -m unittest tests/python/test_aec_library.py

runs the HIP tests too: DIR a softmax library for mi250 and mi300x, the
runtime the test double tests/c/fake_hip.c (`cargo test --test
library_hip_loader` sets all three).
"""
import copy
import json
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
LIBRARY = os.environ.get("AEC_TEST_LIBRARY")
MANIFEST = os.environ.get("AEC_TEST_MANIFEST") or (os.path.join(LIBRARY, "manifest.json") if LIBRARY else None)

_had_torch = "torch" in sys.modules
_shipped = os.path.join(LIBRARY, "python") if LIBRARY else None
MODULE_DIR = (
    _shipped
    if _shipped and os.path.isfile(os.path.join(_shipped, "aec_library.py"))
    else os.path.join(HERE, "..", "..", "templates", "library")
)
sys.path.insert(0, os.path.abspath(MODULE_DIR))
import aec_library as al  # noqa: E402

print(f"testing {al.__file__} with {MANIFEST or 'no manifest'}", file=sys.stderr)

Error = al.Error


def info(shape, dtype="bf16", **kw):
    return al.TensorInfo(shape, dtype, **kw)


class SizeExpressions(unittest.TestCase):
    def test_numbers_names_and_operations(self):
        s = {"B": 2, "H": 3, "Sq": 100}
        self.assertEqual(al.eval_size(7, s), 7)
        self.assertEqual(al.eval_size("Sq", s), 100)
        self.assertEqual(al.eval_size({"mul": ["B", "H", 4]}, s), 24)
        self.assertEqual(al.eval_size({"ceil_div": ["Sq", 128]}, s), 1)
        self.assertEqual(al.eval_size({"ceil_div": [256, 128]}, s), 2)
        self.assertEqual(al.eval_size({"ceil_div": [257, 128]}, s), 3)
        self.assertEqual(al.eval_size({"floor_div": [257, 128]}, s), 2)
        self.assertEqual(al.eval_size({"floor_div": [131, 2]}, s), 65)
        self.assertEqual(al.show_size({"floor_div": ["sms", 2]}), "floor(sms / 2)")
        self.assertEqual(al.eval_size({"mul": []}, s), 1)

    def test_the_rust_example(self):
        # compiler/src/launch_plan.rs: expressions_evaluate_and_round_trip_through_json
        e = json.loads('{"mul":[{"ceil_div":[{"mul":["H","Sq"]},128]},2]}')
        self.assertEqual(al.eval_size(e, {"H": 3, "Sq": 100}), 6)
        self.assertEqual(al.show_size(e), "ceil(H * Sq / 128) * 2")

    def test_refusals(self):
        with self.assertRaisesRegex(Error, "reads `Skv`, which the call does not bind"):
            al.eval_size("Skv", {"H": 1})
        with self.assertRaisesRegex(Error, "divides by 0"):
            al.eval_size({"ceil_div": ["H", 0]}, {"H": 1})
        with self.assertRaisesRegex(Error, "divides by 0"):
            al.eval_size({"floor_div": ["H", 0]}, {"H": 1})
        for bad in ({"add": [1, 2]}, {"ceil_div": [1]}, [1], True, -1, 1.5, None):
            with self.assertRaisesRegex(Error, "malformed size expression"):
                al.eval_size(bad, {})


class KvSplits(unittest.TestCase):
    PLAN = {"blocks": "blocks", "key_blocks": "kb", "max_splits": 128, "rule": ""}

    def splits(self, blocks, kb, sms=132):
        return al.kv_splits_for(self.PLAN, {"blocks": blocks, "kb": kb}, sms)

    def test_matches_the_rust_rule(self):
        # KvSplitPlan::splits, compiler/src/launch_plan.rs (the same cases)
        self.assertEqual(self.splits(264, 100), 1)
        self.assertEqual(self.splits(8, 256), 32)  # two blocks of 8 on each busy SM
        self.assertEqual(self.splits(8, 8), 2)
        self.assertEqual(self.splits(1, 100000), 128)

    def test_edges(self):
        self.assertEqual(al.kv_splits_for(None, {}, 132), 1)
        self.assertEqual(self.splits(0, 100), 1)
        self.assertEqual(self.splits(1, 3), 1)  # fewer than 4 key blocks: no split
        # 263 blocks: two on most SMs already; halves would be four halves.
        self.assertEqual(self.splits(263, 1000), 1)
        self.assertEqual(self.splits(1, 100000, sms=0), 2)  # SMs counted as at least 1
        plan = dict(self.PLAN, max_splits=5)
        self.assertEqual(al.kv_splits_for(plan, {"blocks": 1, "kb": 1000}, 132), 5)

    def test_one_wave_of_resident_blocks(self):
        # Blocks of 93 KB, two per 228 KB SM (KvSplitPlan::splits' wave cap).
        plan = dict(self.PLAN, block_smem_bytes=93440)
        at = {"blocks": 128, "kb": 128}
        self.assertEqual(al.kv_splits_for(plan, at, 132, 228 * 1024), 2)
        self.assertEqual(al.kv_splits_for(plan, at, 132), 2)  # shared memory unknown: no cap, 3 no better
        self.assertEqual(al.kv_splits_for(plan, {"blocks": 200, "kb": 128}, 132, 228 * 1024), 1)

    def test_the_drivers_count_caps_the_splits(self):
        # 32 blocks: 8 splits (two blocks on every SM), not the 9 of
        # ceil(2 * 132 / 32) (three on some), whatever the residency; one
        # block per SM caps them at 4. 140 blocks: a second split is a second
        # wave where two fit, the better balance where three do.
        at = {"blocks": 32, "kb": 128}
        self.assertEqual(al.kv_splits_for(self.PLAN, at, 132), 8)
        self.assertEqual(al.kv_splits_for(self.PLAN, at, 132, 228 * 1024, resident=2), 8)
        self.assertEqual(al.kv_splits_for(self.PLAN, at, 132, 228 * 1024, resident=1), 4)
        plan = dict(self.PLAN, block_smem_bytes=93440)
        self.assertEqual(al.kv_splits_for(plan, at, 132, 228 * 1024, resident=3), 8)
        self.assertEqual(al.kv_splits_for(plan, {"blocks": 200, "kb": 128}, 132, 0, resident=1), 1)
        wide = {"blocks": 140, "kb": 128}
        self.assertEqual(al.kv_splits_for(self.PLAN, wide, 132, 0, resident=2), 1)
        self.assertEqual(al.kv_splits_for(self.PLAN, wide, 132, 0, resident=3), 2)

    def test_split_cost(self):
        # split_cost in compiler/src/cuda/forward/split_kv.rs
        # (bytes in flight not known: 32 KiB a block, one resident 8% slow).
        self.assertEqual(al.split_cost(32, 64, 8, 132, 3), 2 * 9 * 1024)
        self.assertEqual(al.split_cost(32, 64, 9, 132, 3), 3 * 9 * 1024)
        self.assertEqual(al.split_cost(32, 64, 4, 132, 3), 1 * 17 * 1104)
        self.assertEqual(al.split_cost(8, 256, 33, 132, 1), 2 * 9 * 1104)
        # 16 KiB a block: one resident 1.70x, two 1.08x, four full speed.
        self.assertEqual(al.split_cost(8, 256, 33, 132, 1, 16384), 2 * 9 * 1744)
        self.assertEqual(al.split_cost(256, 128, 1, 132, 6, 16384), 2 * 129 * 1104)
        self.assertEqual(al.split_cost(256, 128, 2, 132, 6, 16384), 4 * 65 * 1024)
        # Fixed work of three key blocks beside the keys (a 64-row tile).
        self.assertEqual(al.split_cost(32, 128, 8, 132, 4, 16384, 4096), 2 * 20 * 1104)

    def test_bytes_in_flight(self):
        # The d128 decoding tile (16 KiB in flight a block, six resident):
        # the H200 sweep's fastest splits (KvSplitPlan::splits' test).
        plan = dict(self.PLAN, block_smem_bytes=36864, block_bytes_in_flight=16384, block_fixed_work=1792)
        for blocks, kb, splits in [(256, 128, 2), (128, 128, 4), (192, 128, 2), (64, 512, 8), (128, 256, 4),
                                   (32, 1024, 16), (384, 128, 1)]:
            self.assertEqual(al.kv_splits_for(plan, {"blocks": blocks, "kb": kb}, 132, 0, resident=6), splits)
        # The MQA sm_80 tile (64 rows: Q and partial rows three key blocks'
        # worth): 8 splits, not the 16 that four blocks of 16 KiB a SM would
        # favour without that fixed work.
        mqa = dict(self.PLAN, block_bytes_in_flight=16384, block_fixed_work=4096)
        self.assertEqual(al.kv_splits_for(mqa, {"blocks": 32, "kb": 128}, 132, 0, resident=4), 8)
        self.assertEqual(al.kv_splits_for(dict(mqa, block_fixed_work=0), {"blocks": 32, "kb": 128}, 132, 0,
                                          resident=4), 16)
        # 128 KiB a block: two blocks per SM already keep the DRAM busy.
        fat = dict(plan, block_bytes_in_flight=128 * 1024)
        self.assertEqual(al.kv_splits_for(fat, {"blocks": 256, "kb": 128}, 132, 0, resident=6), 1)

    def test_the_split_launch(self):
        plan = al.Plan("decode", {
            "sizes": [], "buffers": [], "kv_splits": self.PLAN,
            "launches": [
                {"entry": "main", "grid": [{"mul": [2, "kv_splits"]}, 1, "B"], "threads": 128,
                 "dynamic_smem_bytes": 1024, "args": []},
                {"entry": "combine", "grid": ["B", 1, 1], "threads": 128, "dynamic_smem_bytes": 0, "args": []},
            ],
        })
        self.assertEqual(plan.split_launch()["entry"], "main")


class Architectures(unittest.TestCase):
    def test_capabilities(self):
        self.assertEqual(al.arch_for_capability((9, 0)), "sm_90a")
        for minor in (0, 6, 7, 9):
            self.assertEqual(al.arch_for_capability((8, minor)), "sm_80")
        for cap in ((7, 5), (10, 0), (12, 0)):
            with self.assertRaisesRegex(Error, rf"compute capability {cap[0]}\.{cap[1]}: aec builds no kernels"):
                al.arch_for_capability(cap)
        with self.assertRaisesRegex(Error, "9.0 only"):
            al.arch_for_capability((9, 1))


class ManifestFormat(unittest.TestCase):
    def test_format_and_shape(self):
        with self.assertRaisesRegex(Error, "x.json: format 1, but this module reads format 4"):
            al.check_manifest({"format": 1, "variants": []}, "x.json")
        with self.assertRaisesRegex(Error, "no `format` field"):
            al.check_manifest({"variants": []})
        with self.assertRaisesRegex(Error, "not a JSON object"):
            al.check_manifest([])
        with self.assertRaisesRegex(Error, "no `variants` list"):
            al.check_manifest({"format": 4})
        with self.assertRaisesRegex(Error, "variant 'X' has no `kernels`"):
            al.check_manifest({"format": 4, "variants": [{"name": "X", "pattern": "parallel", "inputs": []}]})
        with self.assertRaisesRegex(Error, "unknown pattern 'other'"):
            al.check_manifest({"format": 4, "variants": [{"name": "X", "pattern": "other", "inputs": [], "kernels": []}]})
        self.assertEqual(al.check_manifest({"format": 4, "variants": []})["format"], 4)

    def test_reading(self):
        with tempfile.TemporaryDirectory() as d:
            with self.assertRaisesRegex(Error, "manifest.json: .*library written by `aec compile`"):
                al.read_manifest(os.path.join(d, "absent"))
            with open(os.path.join(d, "manifest.json"), "w") as fh:
                fh.write("{not json")
            with self.assertRaisesRegex(Error, "not valid JSON"):
                al.read_manifest(d)
            with open(os.path.join(d, "manifest.json"), "w") as fh:
                json.dump({"format": 5, "variants": []}, fh)
            # load() reads the manifest before it needs PyTorch or a GPU.
            with self.assertRaisesRegex(Error, "format 5, but this module reads format 4"):
                al.load(d)

    def test_imports_without_torch(self):
        if not _had_torch:
            self.assertNotIn("torch", sys.modules, "importing aec_library imported torch")

    def test_load_says_torch_is_needed(self):
        try:
            import torch  # noqa: F401
        except ImportError:
            with tempfile.TemporaryDirectory() as d:
                with open(os.path.join(d, "manifest.json"), "w") as fh:
                    json.dump({"format": 4, "variants": []}, fh)
                with self.assertRaisesRegex(Error, "needs PyTorch"):
                    al.load(d)
        else:
            self.skipTest("PyTorch is installed here")


def _manifest():
    with open(MANIFEST) as fh:
        return al.check_manifest(json.load(fh), MANIFEST)


def _with_cubins(manifest, value):
    """A copy of `manifest` whose CUDA builds all have cubin `value`."""
    m = copy.deepcopy(manifest)
    for v in m["variants"]:
        for k in v["kernels"]:
            for b in k.get("builds") or []:
                if "cubin" in b:
                    b["cubin"] = value
                for key in b.get("modules") or {}:
                    b["modules"][key] = value
    return m


@unittest.skipUnless(MANIFEST, "set AEC_TEST_LIBRARY (cargo test --test library_python does)")
class WithManifest(unittest.TestCase):
    """Against the plans `aec compile` wrote (cubins present or not)."""

    @classmethod
    def setUpClass(cls):
        cls.m = _with_cubins(_manifest(), "kernels/present.cubin")
        cls.v = {v["name"]: v for v in cls.m["variants"]}
        for name in ("Alibi", "Decode", "Mamba2"):
            if name not in cls.v:
                raise AssertionError(f"{MANIFEST} has no variant {name}; compile examples/alibi.rs, decode.rs, mamba2.rs")
        cls.archs = sorted({b["arch"] for k in cls.v["Alibi"]["kernels"] for b in k.get("builds") or [] if "cubin" in b})
        assert cls.archs, "no CUDA builds of Alibi"

    def plan(self, variant, pass_name="forward", arch=None):
        record, cubin = al.select_kernel(self.v[variant], pass_name, arch or self.archs[-1])
        self.assertTrue(cubin)
        return al.Plan(variant, record["plan"])

    def alibi(self, b=2, h=8, sq=100, skv=50, **over):
        t = dict(q=info((b, h, sq, 128)), k=info((b, h, skv, 128)), v=info((b, h, skv, 64)), slopes=info((h,), "f32"))
        t.update(over)
        return {n: x for n, x in t.items() if x is not None}

    # --- architectures and kernel records

    def test_arch_selection(self):
        for arch in self.archs:
            al.check_arch(self.m, arch)
            record, cubin = al.select_kernel(self.v["Alibi"], "forward", arch)
            self.assertEqual(record["pass"], "forward")
            self.assertIn(arch, [b["arch"] for b in record["builds"]])
            self.assertTrue(cubin)
        with self.assertRaisesRegex(Error, r"no kernels for sm_100a, the device's architecture \(compute capability 10\.0\); it has: .*sm_80.*sm_90a"):
            al.check_arch(self.m, "sm_100a", (10, 0))
        with self.assertRaisesRegex(Error, r"Alibi forward: no kernel for sm_75 in this library; it has forward kernels for: "):
            al.select_kernel(self.v["Alibi"], "forward", "sm_75")

    def test_sm90a_gets_the_hopper_kernels(self):
        if "sm_90a" not in self.archs:
            self.skipTest("no sm_90a builds")
        record, _ = al.select_kernel(self.v["Alibi"], "forward", "sm_90a")
        self.assertIn("wgmma", record["plan"]["launches"][0]["entry"])

    def test_sm90a_forward_tensor_maps(self):
        # The warp-specialised sm_90a forward loads q, k and v with TMA
        # copies: its last three arguments are their tensor maps.
        if "sm_90a" not in self.archs:
            self.skipTest("no sm_90a builds")
        record, _ = al.select_kernel(self.v["Alibi"], "forward", "sm_90a")
        launch = record["plan"]["launches"][0]
        kinds = [next(iter(a)) for a in launch["args"]]
        if "tensor_map" not in kinds:
            self.skipTest(f"{launch['entry']} takes no tensor maps")
        self.assertEqual(kinds[-3:], ["tensor_map"] * 3, kinds)
        self.assertNotIn("tensor_map", kinds[:-3])
        p = al.Plan("Alibi", record["plan"])
        call = p.prepare(self.alibi(), sms=132)
        maps = [x for kind, x in call.launches[0][4] if kind == "tensor_map"]
        self.assertEqual([m.buffer for m in maps], ["q", "k", "v"])
        q, k, v = maps
        self.assertEqual((q.dims, k.dims, v.dims), ((128, 100, 16), (128, 50, 16), (64, 50, 16)))
        self.assertEqual((q.strides, v.strides), ((256, 25600), (128, 6400)))
        self.assertEqual([m.box[0] for m in maps], [64, 64, 64])
        self.assertEqual([m.box[2] for m in maps], [1, 1, 1])
        self.assertEqual(q.data_type, 9)
        self.assertEqual(q.encode_args(0x1000)[6:], ((1, 1, 1), 0, 3, 2, 0))
        # HIP cannot launch them.
        with self.assertRaisesRegex(Error, "takes a CUDA tensor map of `q`, which HIP cannot launch"):
            p.prepare(self.alibi(), sms=132, hip=True)

    def test_tuning_table_records_are_chosen_by_gpu_and_bucket(self):
        gpu = "NVIDIA H100 80GB HBM3"
        alibi = copy.deepcopy(self.v["Alibi"])
        default = next(k for k in alibi["kernels"] if k["pass"] == "forward" and any(b["arch"] == "sm_90a" for b in k["builds"]))
        tuned = copy.deepcopy(default)
        tuned["entry"] = "aec_fwd_tuned"
        tuned["builds"] = [dict(b, cubin="kernels/aec_fwd_tuned.sm_90a.cubin") for b in tuned["builds"]]
        tuned["tuned_for"] = [{"gpu": gpu, "sizes": {"B": 2, "H": 8, "Hkv": 8, "Sq": 512, "Skv": 1024}, "bucketed": ["Sq", "Skv"]}]
        # First in the list: the default choice must still skip it.
        alibi["kernels"].insert(0, tuned)
        record, cubin = al.select_kernel(alibi, "forward", "sm_90a")
        self.assertIsNot(record, tuned)
        self.assertNotEqual(cubin, "kernels/aec_fwd_tuned.sm_90a.cubin")
        call = dict(B=2, H=8, Hkv=8, Sq=450, Skv=1000, kv_splits=1)
        found = al.select_tuned(alibi, "forward", "sm_90a", gpu, call, 132)
        self.assertIsNotNone(found)
        self.assertIs(found[0], tuned)
        self.assertEqual(found[1]["cubin"], "kernels/aec_fwd_tuned.sm_90a.cubin")
        self.assertIs(found[2], tuned["tuned_for"][0])
        for why, args in [
            ("another GPU", ("sm_90a", "NVIDIA H200", call, 132)),
            ("another architecture", ("sm_80", gpu, call, 132)),
            ("Sq 513 is bucket 1024", ("sm_90a", gpu, dict(call, Sq=513), 132)),
            ("Skv 1025 is bucket 2048", ("sm_90a", gpu, dict(call, Skv=1025), 132)),
            ("B is matched exactly", ("sm_90a", gpu, dict(call, B=3), 132)),
            ("a size the call lacks", ("sm_90a", gpu, {n: x for n, x in call.items() if n != "Hkv"}, 132)),
        ]:
            self.assertIsNone(al.select_tuned(alibi, "forward", *args), why)
        self.assertIsNone(al.select_tuned(alibi, "backward", "sm_90a", gpu, call, 132))
        # A tuned backward: chosen for its pass only, never as the default.
        default_bwd = next(k for k in alibi["kernels"] if k["pass"] == "backward" and "plan" in k
                           and any(b["arch"] == "sm_90a" for b in k["builds"]))
        tuned_bwd = dict(copy.deepcopy(default_bwd), source="kernels/aec_bwd_tuned.cu", tuned_for=tuned["tuned_for"])
        tuned_bwd["builds"] = [dict(b, cubin="kernels/aec_bwd_tuned.sm_90a.cubin") for b in tuned_bwd["builds"]]
        alibi["kernels"].insert(0, tuned_bwd)
        self.assertIs(al.select_kernel(alibi, "backward", "sm_90a")[0], default_bwd)
        found = al.select_tuned(alibi, "backward", "sm_90a", gpu, call, 132)
        self.assertIsNotNone(found)
        self.assertIs(found[0], tuned_bwd)
        self.assertEqual(found[1]["cubin"], "kernels/aec_bwd_tuned.sm_90a.cubin")
        self.assertIs(al.select_tuned(alibi, "forward", "sm_90a", gpu, call, 132)[0], tuned)
        self.assertIsNone(al.select_tuned(alibi, "backward", "sm_90a", gpu, dict(call, B=3), 132))
        # An untuned choice for a declared workload names a product and its
        # multiprocessors; a measured record listed before it wins its bucket.
        chosen = dict(copy.deepcopy(tuned), entry="aec_fwd_chosen")
        chosen["builds"] = [dict(b, cubin="kernels/aec_fwd_chosen.sm_90a.cubin") for b in chosen["builds"]]
        chosen["tuned_for"] = [{"device": "h100", "sms": 132, "chosen_by": "cost model",
                                "sizes": {"B": 1, "H": 12, "Hkv": 12, "Sq": 512, "Skv": 512}, "bucketed": ["Sq", "Skv"]}]
        alibi["kernels"].append(chosen)
        small = dict(B=1, H=12, Hkv=12, Sq=300, Skv=300)
        self.assertIs(al.select_tuned(alibi, "forward", "sm_90a", gpu, small, 132)[0], chosen)
        self.assertIs(al.select_tuned(alibi, "forward", "sm_90a", "NVIDIA H100 NVL", small, 132)[0], chosen)
        for why, args in [
            ("another product", ("NVIDIA H200", small, 132)),
            ("fewer multiprocessors (H100 PCIe)", ("NVIDIA H100 PCIe", small, 114)),
            ("another bucket", (gpu, dict(small, Sq=513), 132)),
        ]:
            self.assertIsNone(al.select_tuned(alibi, "forward", "sm_90a", *args), why)
        measured = copy.deepcopy(tuned)
        measured["tuned_for"] = [dict(tuned["tuned_for"][0], sizes=chosen["tuned_for"][0]["sizes"])]
        alibi["kernels"].insert(0, measured)
        self.assertIs(al.select_tuned(alibi, "forward", "sm_90a", gpu, small, 132)[0], measured)
        self.assertEqual([al.bucket_len(n) for n in (0, 1, 2, 3, 450, 512, 513, 1 << 40)], [1, 1, 2, 4, 512, 512, 1024, 1 << 31])
        broken = copy.deepcopy(self.m)
        next(v for v in broken["variants"] if v["name"] == "Alibi")["kernels"].append(dict(tuned, tuned_for=[{"gpu": gpu, "sizes": {"Sq": "512"}}]))
        with self.assertRaisesRegex(Error, r"variant Alibi: kernels\[\d+\]\.tuned_for\[0\]: `sizes` is not an object of integers"):
            al.check_manifest(broken)
        for item, message in [
            ({"device": "h100", "sizes": {}}, "`device` needs a product name and `sms`"),
            ({"device": "h100", "sms": 0, "sizes": {}}, r"`sms` its multiprocessors \(1 to 65535\)"),
            ({"gpu": gpu, "device": "h100", "sms": 132, "sizes": {}}, "has both `gpu`"),
            ({"sizes": {}}, "no `gpu` name"),
        ]:
            broken = copy.deepcopy(self.m)
            next(v for v in broken["variants"] if v["name"] == "Alibi")["kernels"].append(dict(tuned, tuned_for=[item]))
            with self.assertRaisesRegex(Error, message):
                al.check_manifest(broken)

    def test_without_cubins(self):
        bare = _with_cubins(self.m, None)
        arch = self.archs[0]
        with self.assertRaisesRegex(Error, f"{arch} kernels but no cubins .*without NVRTC"):
            al.check_arch(bare, arch)
        alibi = next(v for v in bare["variants"] if v["name"] == "Alibi")
        with self.assertRaisesRegex(Error, f"Alibi forward: the library has no {arch} cubin .*NVRTC"):
            al.select_kernel(alibi, "forward", arch)

    def test_backward_availability(self):
        arch = self.archs[-1]
        self.assertIsNone(al.backward_unavailable(self.v["Alibi"], arch))
        # Recurrent variants have a backward too: two modules per build.
        self.assertIsNone(al.backward_unavailable(self.v["Mamba2"], arch))
        record, build = al.select_build(self.v["Mamba2"], "backward", arch)
        self.assertEqual(record["pass"], "backward")
        self.assertEqual(al.build_modules(self.v["Mamba2"], record, build), {"states": "kernels/present.cubin"})
        # A build that lacks the states pass's module is refused by name.
        broken = copy.deepcopy(self.v["Mamba2"])
        for k in broken["kernels"]:
            for b in k.get("builds") or []:
                b.pop("modules", None)
        with self.assertRaisesRegex(Error, rf"Mamba2 backward: launch aec_rec_states_mamba2_\w+ is in the module `states`, which the {arch} build is not listed"):
            al.select_kernel(broken, "backward", arch)
        # A recurrent backward the compiler could not generate says why.
        skipped = copy.deepcopy(self.v["Mamba2"])
        skipped["kernels"] = [k for k in skipped["kernels"] if k["pass"] == "forward"]
        skipped["kernels"].append({"pass": "backward", "arch": arch, "skipped": "head dimension Dk = 16 is not supported"})
        self.assertIn("Dk = 16", al.backward_unavailable(skipped, arch))
        with self.assertRaisesRegex(Error, "Mamba2 backward: no backward kernels: head dimension Dk = 16"):
            al.select_kernel(skipped, "backward", arch)
        # A parallel variant whose backward the compiler skipped says why.
        skipped = copy.deepcopy(self.v["Alibi"])
        skipped["kernels"] = [k for k in skipped["kernels"] if k["pass"] == "forward"]
        skipped["kernels"].append({"pass": "backward", "skipped": "the mask reads an indexed input"})
        with self.assertRaisesRegex(Error, "Alibi backward: no backward kernels: the mask reads an indexed input"):
            al.select_kernel(skipped, "backward", arch)
        skipped["kernels"].pop()
        with self.assertRaisesRegex(Error, f"Alibi backward: no backward kernel for {arch} in this library \\(it has: none\\)"):
            al.select_kernel(skipped, "backward", arch)

    # --- binding and checks

    def test_binds_sizes_and_plans_the_launches(self):
        for arch in self.archs:
            p = self.plan("Alibi", arch=arch)
            call = p.prepare(self.alibi(), sms=132)
            self.assertEqual(call.sizes, dict(B=2, H=8, Hkv=8, Sq=100, Skv=50, kv_splits=1))
            allocs = {n: (d, s, z) for n, d, s, z in call.allocations}
            self.assertEqual(allocs["o"], ("bf16", (2, 8, 100, 64), False))
            self.assertEqual(allocs["row_outputs"], ("f32", (3, 2, 8, 100), False))
            self.assertEqual(call.outputs, ["o", "row_outputs"])
            [(entry, grid, threads, smem, args)] = call.launches
            if arch == "sm_90a":
                # Persistent: min(units, SMs) blocks, a unit two row blocks
                # (here one: ceil(100 / 128)) of a head and batch.
                self.assertEqual(grid, (16, 1, 1))
                self.assertEqual(p.prepare(self.alibi(), sms=7).launches[0][1], (7, 1, 1))
            else:
                self.assertEqual(grid, (1, 8, 2))
            self.assertGreater(threads, 0)
            # The sm_90a kernel loads q, k and v with TMA copies: their tensor
            # maps come last (test_sm90a_forward_tensor_maps).
            maps = [x.buffer for kind, x in args if kind == "tensor_map"]
            self.assertIn(maps, ([], ["q", "k", "v"]))
            if maps:
                self.assertEqual(arch, "sm_90a")
                args = args[:-3]
            self.assertEqual(
                args,
                [("ptr", "q"), ("ptr", "k"), ("ptr", "v"), ("ptr", "o"), ("ptr", "row_outputs"), ("ptr", "slopes")]
                + [("i32", x) for x in (2, 8, 8, 100, 50)],
            )

    def test_shape_errors_name_the_tensor_and_the_sizes(self):
        p = self.plan("Alibi")
        cases = [
            (dict(q=info((2, 8, 100, 64))), r"^Alibi forward: q: expected \[B, H, Sq, 128\] = \[2, 8, 100, 128\], got \[2, 8, 100, 64\]$"),
            (dict(k=info((3, 8, 50, 128))), r"k: expected \[B, H, Skv, 128\] = \[2, 8, 50, 128\], got \[3, 8, 50, 128\]"),
            (dict(v=info((2, 8, 51, 64))), r"v: expected \[B, H, Skv, 64\] = \[2, 8, 50, 64\], got \[2, 8, 51, 64\]"),
            (dict(k=info((2, 4, 50, 128))), r"k: expected \[B, H, Skv, 128\] = \[2, 8, 50, 128\], got \[2, 4, 50, 128\]"),
            (dict(q=info((8, 100, 128))), r"q: expected \[B, H, Sq, 128\] = \[2, 8, \?, 128\], got \[8, 100, 128\]"),
            (dict(slopes=info((7,), "f32")), r"slopes: expected \[H\] = \[8\], got \[7\]"),
            (dict(slopes=info((8, 1), "f32")), r"slopes: expected \[H\] = \[8\], got \[8, 1\]"),
        ]
        for over, pattern in cases:
            with self.subTest(over=list(over)):
                with self.assertRaisesRegex(Error, pattern):
                    p.prepare(self.alibi(**over))

    def test_tensor_errors(self):
        p = self.plan("Alibi")
        cases = [
            (dict(q=info((2, 8, 100, 128), "f32")), r"Alibi forward: q: expected dtype bf16 \(torch.bfloat16\), got f32"),
            (dict(k=info((2, 8, 50, 128), "f16")), r"k: expected dtype bf16"),
            (dict(slopes=info((8,), "bf16")), r"slopes: expected dtype f32 \(torch.float32\), got bf16"),
            (dict(slopes=info((8,), "torch.float64")), r"slopes: expected dtype f32 .*got torch.float64"),
            (dict(v=info((2, 8, 50, 64), contiguous=False)), r"v: not contiguous .*\[B, H, Skv, 64\].*v.contiguous\(\)"),
            (dict(q=info((2, 8, 100, 128), device="cpu")), r"q: a cpu tensor; the kernels need it on cuda:0"),
            (dict(k=info((2, 8, 50, 128), device="cuda:1")), r"k: on cuda:1, but the library was loaded for cuda:0"),
            (dict(q=info((2, 8, 100, 128), aligned=False)), r"q: its data does not start at a multiple of 16 bytes"),
            (dict(extra=info((1,))), r"Alibi forward: unknown input `extra`; it takes q, k, v, slopes"),
            (dict(slopes=None), r"Alibi forward: missing input `slopes` \[H\] f32"),
            (dict(q=None, k=None), r"missing inputs `q` \[B, H, Sq, 128\] bf16, `k` \[B, H, Skv, 128\] bf16"),
        ]
        for over, pattern in cases:
            with self.subTest(over=list(over)):
                with self.assertRaisesRegex(Error, pattern):
                    p.prepare(self.alibi(**over), device="cuda:0")

    def test_size_errors(self):
        p = self.plan("Alibi", arch=self.archs[0])
        with self.assertRaisesRegex(Error, r"Alibi forward: Sq = 0 \(from q's dim 2\): every size must be at least 1"):
            p.prepare(self.alibi(sq=0))
        with self.assertRaisesRegex(Error, r"Skv = 2147483648 \(from k's dim 2\): every size must fit a 32-bit int"):
            p.prepare(self.alibi(skv=2**31))
        with self.assertRaisesRegex(Error, r"launch \w+: grid \[1, 70000, 2\] = \[ceil\(Sq / \d+\), H, B\] is beyond CUDA's limits .*H=70000"):
            p.prepare(self.alibi(h=70000))
        with self.assertRaisesRegex(Error, r"grid \[1, 8, 65536\]"):
            p.prepare(self.alibi(b=65536))
        with self.assertRaisesRegex(Error, "unknown optional output `lse`"):
            p.prepare(self.alibi(), want=("lse",))

    def test_equal_sizes(self):
        # Alibi declares k and v with H heads: Hkv is H. A plan whose k reads
        # Hkv (as a GQA variant's does) refuses k and v with other heads.
        p = self.plan("Alibi")
        self.assertEqual(p.equal, [("Hkv", "H")])
        plan = copy.deepcopy(p.plan)
        for b in plan["buffers"]:
            if b["name"] in ("k", "v"):
                b["shape"][1] = "Hkv"
        gqa = al.Plan("Alibi", plan)
        self.assertEqual(gqa.prepare(self.alibi()).sizes["Hkv"], 8)
        with self.assertRaisesRegex(Error, r"Hkv = 4 \(from k's dim 1\) must equal H = 8 \(from q's dim 1\)"):
            gqa.prepare(self.alibi(k=info((2, 4, 50, 128)), v=info((2, 4, 50, 64))))

    def test_fixed_and_multiple_of(self):
        p = self.plan("Decode")
        self.assertEqual(p.fixed, {"Sq": 1})
        self.assertEqual(p.multiple_of, [("H", "Hkv")])

        def decode(h=8, hkv=2, sq=1, skv=1000, b=1):
            return dict(q=info((b, h, sq, 128)), k=info((b, hkv, skv, 128)), v=info((b, hkv, skv, 64)))

        self.assertEqual(p.prepare(decode()).sizes["Hkv"], 2)
        with self.assertRaisesRegex(Error, r"Decode forward: Sq = 4 \(from q's dim 2\), but Decode fixes Sq = 1"):
            p.prepare(decode(sq=4))
        with self.assertRaisesRegex(Error, r"H = 6 \(from q's dim 1\) must be a multiple of Hkv = 4 \(from k's dim 1\)"):
            p.prepare(decode(h=6, hkv=4))

    def test_split_kv(self):
        for arch in self.archs:
            p = self.plan("Decode", arch=arch)
            if not p.kv_plan:
                continue
            self.assertEqual(p.kv_plan["max_splits"], 128)
            few = dict(q=info((1, 8, 1, 128)), k=info((1, 8, 4096, 128)), v=info((1, 8, 4096, 64)))
            call = p.prepare(few, sms=132)
            expected = al.kv_splits_for(p.kv_plan, call.sizes, 132)
            self.assertGreater(expected, 1)
            self.assertEqual(call.kv_splits, expected)
            allocs = {n: s for n, _, s, _ in call.allocations}
            self.assertEqual(allocs["opart"], (expected, 1, 8, 1, 64))
            self.assertEqual(allocs["spart"][:4], (expected, 1, 8, 1))
            self.assertEqual(len(call.launches), 2)
            self.assertTrue(call.launches[1][0].endswith("_combine"))
            self.assertIn(("ptr", "opart"), call.launches[0][4])
            self.assertIn(("i32", expected), call.launches[0][4])
            # Enough blocks: one split, no workspaces, no combine, null pointers.
            many = dict(q=info((64, 8, 1, 128)), k=info((64, 8, 4096, 128)), v=info((64, 8, 4096, 64)))
            call = p.prepare(many, sms=132)
            self.assertEqual(call.kv_splits, 1)
            self.assertNotIn("opart", [a[0] for a in call.allocations])
            self.assertEqual(len(call.launches), 1)
            self.assertIn(("ptr", None), call.launches[0][4])
            # Forced splits.
            self.assertEqual(p.prepare(many, sms=132, kv_splits=3).kv_splits, 3)
            self.assertEqual(len(p.prepare(many, sms=132, kv_splits=3).launches), 2)
            for bad in (0, 129, 2.5):
                with self.assertRaisesRegex(Error, "kv_splits=.*expected an int from 1 to 128"):
                    p.prepare(many, kv_splits=bad)
        alibi = self.plan("Alibi")
        self.assertEqual(alibi.prepare(self.alibi(), kv_splits=1).kv_splits, 1)
        with self.assertRaisesRegex(Error, "kv_splits=2, but this plan has no split-KV launch"):
            alibi.prepare(self.alibi(), kv_splits=2)

    def test_recurrent_plan(self):
        p = self.plan("Mamba2")
        p.labels = {"state_in": "initial_state"}

        def mamba(b=2, h=4, s=77, **over):
            t = dict(q=info((b, h, s, 128)), k=info((b, h, s, 128)), v=info((b, h, s, 64)),
                     a=info((h,), "f32"), dt=info((b, h, s), "f32"))
            t.update(over)
            return t

        call = p.prepare(mamba())
        self.assertEqual(call.sizes, dict(B=2, H=4, S=77, kv_splits=1))
        self.assertEqual(call.outputs, ["o"])
        args = call.launches[0][4]
        self.assertIn(("ptr", None), args)  # state_in and state_out absent
        call = p.prepare(mamba(state_in=info((2, 4, 128, 64), "f32")), want=("state_out",))
        self.assertEqual(call.outputs, ["o", "state_out"])
        self.assertIn(("state_out", "f32", (2, 4, 128, 64), False), call.allocations)
        # Every pointer given but those the plan passes null: cu_seqlens (equal
        # lengths) and, for the sm_90a kernel, the segment schedule (chains
        # run whole).
        plan_args = p.launch_plans[0]["args"]
        nulls = {a["null"] for a in plan_args if "null" in a}
        self.assertIn("cu_seqlens", nulls)
        self.assertLessEqual(nulls, {"cu_seqlens", "sched", "carry"})
        for a, given in zip(plan_args, call.launches[0][4]):
            if "null" in a:
                self.assertEqual(given, ("ptr", None), a)
            else:
                self.assertNotEqual(given, ("ptr", None), a)
        with self.assertRaisesRegex(Error, r"Mamba2 forward: initial_state \(state_in\): expected \[B, H, 128, 64\] = \[2, 4, 128, 64\], got \[2, 4, 64, 128\]"):
            p.prepare(mamba(state_in=info((2, 4, 64, 128), "f32")))
        with self.assertRaisesRegex(Error, r"dt: expected \[B, H, S\] = \[2, 4, 77\], got \[2, 4, 76\]"):
            p.prepare(mamba(dt=info((2, 4, 76), "f32")))
        with self.assertRaisesRegex(Error, r"missing input `a` \[H\] f32"):
            p.prepare({n: x for n, x in mamba().items() if n != "a"})
        with self.assertRaisesRegex(Error, r"unknown input `state_out`; it takes q, k, v, a, dt, state_in \(optional\)"):
            p.prepare(mamba(state_out=info((2, 4, 128, 64), "f32")))

    def test_recurrent_backward_plan(self):
        for arch in self.archs:
            p = self.plan("Mamba2", "backward", arch=arch)
            b, h, s = 2, 4, 77  # S is not a multiple of the 64-step chunk: 2 chunks

            def mamba(**over):
                t = dict(q=info((b, h, s, 128)), k=info((b, h, s, 128)), v=info((b, h, s, 64)),
                         a=info((h,), "f32"), dt=info((b, h, s), "f32"), do=info((b, h, s, 64)))
                t.update(over)
                return {n: x for n, x in t.items() if x is not None}

            call = p.prepare(mamba(), sms=132)
            self.assertEqual(call.sizes, dict(B=2, H=4, S=77, kv_splits=1))
            allocs = {n: (d, sh, z) for n, d, sh, z in call.allocations}
            self.assertEqual(allocs["dq"], ("bf16", (2, 4, 77, 128), False))
            self.assertEqual(allocs["dv"], ("bf16", (2, 4, 77, 64), False))
            self.assertEqual(allocs["da"], ("f32", (4,), True))
            self.assertEqual(allocs["ddt"], ("f32", (2, 4, 77), True))
            self.assertEqual(allocs["states"], ("bf16", (2, 4, 2, 128, 64), False))
            self.assertEqual(allocs["dstates"], ("bf16", (2, 4, 2, 128, 64), False))
            self.assertEqual(allocs["dlog"], ("f32", (2, 4, 77), True))
            self.assertNotIn("d_state_in", allocs)
            self.assertEqual(set(call.outputs), {"dq", "dk", "dv", "da", "ddt"})
            # The states pass first, from its own module, then the backward kernels.
            entries = [e for e, *_ in call.launches]
            self.assertTrue(entries[0].startswith("aec_rec_states_mamba2_"), entries)
            self.assertEqual([e.rsplit("_", 1)[1] for e in entries[1:]], ["dstate", "dqk", "dv", "decay"])
            self.assertEqual(call.modules, ["states", None, None, None, None])
            grids = [g for _, g, *_ in call.launches]
            self.assertEqual(grids[0], (1, 4, 2))  # Dv / 64 slices
            self.assertEqual(grids[1:], [(1, 4, 2), (4, 4, 2), (2, 4, 2), (1, 4, 2)])
            states_args = call.launches[0][4]
            self.assertEqual(states_args[:5], [("ptr", n) for n in ("q", "k", "v", "a", "dt")])
            self.assertEqual(states_args[5:7], [("ptr", None), ("ptr", None)])  # no state_in; state_out never
            self.assertIn(("ptr", "states"), states_args)
            self.assertIn(("ptr", None), call.launches[1][4])  # no d_state_out, no d_state_in
            # With the forward's initial state, the final state's gradient, and dS_in asked for.
            st = info((2, 4, 128, 64), "f32")
            call = p.prepare(mamba(state_in=st, d_state_out=st), want=("d_state_in",))
            self.assertIn(("d_state_in", "f32", (2, 4, 128, 64), False), call.allocations)
            self.assertIn("d_state_in", call.outputs)
            self.assertEqual(call.launches[0][4][5:7], [("ptr", "state_in"), ("ptr", None)])
            self.assertNotIn(("ptr", None), call.launches[1][4][:-4])
            self.assertEqual(call.launches[1][4][-4], ("ptr", None))  # cu_seqlens
            # Refusals name the tensor and its shape.
            with self.assertRaisesRegex(Error, r"Mamba2 backward: do: expected \[B, H, S, 64\] = \[2, 4, 77, 64\], got \[2, 4, 77, 128\]"):
                p.prepare(mamba(do=info((2, 4, 77, 128))))
            with self.assertRaisesRegex(Error, r"Mamba2 backward: missing input `do` \[B, H, S, 64\] bf16"):
                p.prepare(mamba(do=None))
            with self.assertRaisesRegex(Error, r"d_state_out: expected \[B, H, 128, 64\] = \[2, 4, 128, 64\], got \[2, 4, 64, 128\]"):
                p.prepare(mamba(d_state_out=info((2, 4, 64, 128), "f32")))
            with self.assertRaisesRegex(Error, r"d_state_out: expected dtype f32"):
                p.prepare(mamba(d_state_out=info((2, 4, 128, 64))))
            with self.assertRaisesRegex(Error, r"unknown optional output `d_norm_in` \(it has: d_state_in\)"):
                p.prepare(mamba(), want=("d_norm_in",))
            with self.assertRaisesRegex(Error, r"unknown input `norm_in`"):
                p.prepare(mamba(norm_in=info((2, 4, 128), "f32")))

    def test_backward_plan(self):
        p = self.plan("Alibi", "backward")
        t = self.alibi()
        t.update(o=info((2, 8, 100, 64)), row_outputs=info((3, 2, 8, 100), "f32"), dout=info((2, 8, 100, 64)))
        call = p.prepare(t)
        allocs = {n: (d, s, z) for n, d, s, z in call.allocations}
        self.assertEqual(allocs["dslopes"], ("f32", (8,), True))
        self.assertEqual(allocs["dq"], ("bf16", (2, 8, 100, 128), False))
        self.assertEqual(allocs["dk"], ("bf16", (2, 8, 50, 128), False))
        self.assertEqual(allocs["dv"], ("bf16", (2, 8, 50, 64), False))
        self.assertEqual(set(call.outputs), {"dq", "dk", "dv", "dslopes"})
        self.assertEqual([e.rsplit("_", 1)[1] for e, *_ in call.launches], ["pre", "main", "post"])
        with self.assertRaisesRegex(Error, r"Alibi backward: row_outputs: expected \[3, B, H, Sq\] = \[3, 2, 8, 100\], got \[2, 2, 8, 100\]"):
            p.prepare(dict(t, row_outputs=info((2, 2, 8, 100), "f32")))
        with self.assertRaisesRegex(Error, r"Alibi backward: missing input `dout`"):
            p.prepare({n: x for n, x in t.items() if n != "dout"})

    def test_every_plan_of_the_library_prepares(self):
        # Each plan (any variant, pass, architecture, CUDA or HIP) takes inputs of its own shapes.
        base = dict(B=2, H=4, Hkv=2, Sq=100, Skv=77, S=77)
        count = 0
        for v in self.m["variants"]:
            for k in v["kernels"]:
                if "plan" not in k:
                    continue
                p = al.Plan(v["name"], k["plan"])
                sizes = dict(base, **p.fixed)
                for a, b in p.equal:
                    sizes[a] = sizes[b]
                infos = {}
                for b in k["plan"]["buffers"]:
                    if b["role"] in ("input", "optional_input"):
                        infos[b["name"]] = info(tuple(al.eval_size(e, sizes) for e in b["shape"]), b["dtype"])
                want = p.optional_outputs
                call = p.prepare(infos, want=want, sms=132)
                for n in p.size_names:
                    self.assertEqual(call.sizes[n], sizes[n], f"{v['name']} {k['pass']}: {n}")
                self.assertTrue(call.launches)
                for entry, grid, threads, smem, args in call.launches:
                    self.assertTrue(all(g >= 1 for g in grid))
                    self.assertGreater(threads, 0)
                    self.assertGreaterEqual(smem, 0)
                    names = {n for n, *_ in call.allocations} | set(infos)
                    for kind, x in args:
                        if kind == "ptr" and x is not None:
                            self.assertIn(x, names)
                        if kind == "tensor_map":
                            # A map of a given 16-bit input, inside its elements.
                            self.assertIn(x.buffer, infos)
                            self.assertIn(x.dtype, ("bf16", "f16"))
                            elements = 1
                            for d in infos[x.buffer].shape:
                                elements *= d
                            self.assertLessEqual(x.dims[0] * x.dims[1] * x.dims[2], elements)
                            self.assertEqual(x.strides[0] % 16, 0)
                count += 1
        self.assertGreaterEqual(count, 5)



# --------------------------------------------------------------------------
# Tensor maps (ArgPlan::TensorMap): the sm_90a forwards that load q, k and v
# with TMA copies take three, encoded per call with cuTensorMapEncodeTiled.


def _tma_plan(dtype="bf16", dqk=128, dv=64, block_m=128, block_n=128):
    """A plan shaped like an sm_90a warp-specialised forward with TMA loads:
    q, k, v (and a custom f32 input), o, the row outputs, sizes, then the
    tensor maps of q, k and v as its last three arguments."""
    bhs = lambda heads, rows, d: ["B", heads, rows, d]  # noqa: E731
    buf = lambda name, role, shape, dt=dtype: {"name": name, "role": role, "dtype": dt, "shape": shape, "doc": name}  # noqa: E731
    tm = lambda name, d, heads, rows, box_rows: {  # noqa: E731
        "tensor_map": {"buffer": name, "dims": [d, rows, {"mul": ["B", heads]}], "box": [64, box_rows, 1]}}
    return {
        "pass": "forward",
        "sizes": [{"name": n} for n in ("B", "H", "Hkv", "Sq", "Skv")],
        "equal": [["Hkv", "H"]],
        "buffers": [
            buf("q", "input", bhs("H", "Sq", dqk)),
            buf("k", "input", bhs("Hkv", "Skv", dqk)),
            buf("v", "input", bhs("Hkv", "Skv", dv)),
            buf("slopes", "input", ["H"], "f32"),
            buf("o", "output", bhs("H", "Sq", dv)),
            buf("row_outputs", "output", [1, "B", "H", "Sq"], "f32"),
        ],
        "launches": [{
            "entry": "aec_fwd_tma_wgmma_ws",
            "grid": [{"ceil_div": ["Sq", block_m]}, "H", "B"],
            "threads": 384,
            "dynamic_smem_bytes": 180224,
            "args": [{"ptr": n} for n in ("q", "k", "v", "o", "row_outputs", "slopes")]
            + [{"i32": n} for n in ("B", "H", "Hkv", "Sq", "Skv")]
            + [tm("q", dqk, "H", "Sq", block_m), tm("k", dqk, "Hkv", "Skv", block_n), tm("v", dv, "Hkv", "Skv", block_n)],
        }],
    }


def _tma_manifest(plan):
    """A manifest of one parallel variant `Tma` whose sm_90a forward is `plan`."""
    return al.check_manifest({
        "format": 4,
        "variants": [{
            "name": "Tma",
            "pattern": "parallel",
            "inputs": [{"name": n} for n in ("q", "k", "v", "slopes")],
            "kernels": [{
                "pass": "forward",
                "entry": plan["launches"][0]["entry"],
                "plan": plan,
                "builds": [{"arch": "sm_90a", "cubin": "kernels/tma.sm_90a.cubin"}],
            }],
        }],
    })


def _tma_inputs(b=2, h=3, sq=100, skv=77, dtype="bf16", dqk=128, dv=64, **over):
    t = dict(q=info((b, h, sq, dqk), dtype), k=info((b, h, skv, dqk), dtype), v=info((b, h, skv, dv), dtype),
             slopes=info((h,), "f32"))
    t.update(over)
    return t


class FakeEncoder:
    """A driver's tensor-map calls without a GPU: records each
    encode_tensor_map call and answers `result`."""

    def __init__(self, result=0):
        self.result, self.calls = result, []

    def encode_tensor_map(self, *args):
        self.calls.append(args)
        return self.result

    def error_name(self, res):
        return {1: "CUDA_ERROR_INVALID_VALUE"}.get(res, f"CUDA error {res}")


class TensorMaps(unittest.TestCase):
    def prepare(self, plan=None, **kw):
        inputs = kw.pop("inputs", None) or _tma_inputs()
        return al.Plan("Tma", plan or _tma_plan()).prepare(inputs, sms=132, **kw)

    def maps(self, call, launch=0):
        return [x for kind, x in call.launches[launch][4] if kind == "tensor_map"]

    def test_an_sm90a_plan_with_tensor_maps_prepares(self):
        m = _tma_manifest(_tma_plan())
        record, cubin = al.select_kernel(m["variants"][0], "forward", "sm_90a")
        self.assertEqual(cubin, "kernels/tma.sm_90a.cubin")
        call = al.Plan("Tma", record["plan"]).prepare(_tma_inputs(), sms=132, device="cuda:0")
        self.assertEqual(call.sizes, dict(B=2, H=3, Hkv=3, Sq=100, Skv=77, kv_splits=1))
        args = call.launches[0][4]
        self.assertEqual(args[:6], [("ptr", n) for n in ("q", "k", "v", "o", "row_outputs", "slopes")])
        self.assertEqual(args[6:11], [("i32", x) for x in (2, 3, 3, 100, 77)])
        self.assertEqual([k for k, _ in args[11:]], ["tensor_map"] * 3)
        q, k, v = self.maps(call)
        self.assertEqual((q.buffer, k.buffer, v.buffer), ("q", "k", "v"))
        # Extents innermost first: columns, rows, B * heads matrices.
        self.assertEqual(q.dims, (128, 100, 6))
        self.assertEqual(k.dims, (128, 77, 6))
        self.assertEqual(v.dims, (64, 77, 6))
        # Byte strides: a row, a matrix (bf16).
        self.assertEqual(q.strides, (256, 256 * 100))
        self.assertEqual(k.strides, (256, 256 * 77))
        self.assertEqual(v.strides, (128, 128 * 77))
        self.assertEqual(q.box, (64, 128, 1))
        self.assertEqual((q.dtype, q.data_type), ("bf16", 9))

    def test_encode_arguments(self):
        q, k, v = self.maps(self.prepare())
        self.assertEqual(
            q.encode_args(0x7F0000001000),
            (9, 3, 0x7F0000001000, (128, 100, 6), (256, 25600), (64, 128, 1), (1, 1, 1), 0, 3, 2, 0),
        )
        self.assertEqual(v.encode_args(0x2000)[3:6], ((64, 77, 6), (128, 9856), (64, 128, 1)))
        # f16: data type 6, the same byte strides.
        call = self.prepare(_tma_plan("f16"), inputs=_tma_inputs(dtype="f16"))
        q16 = self.maps(call)[0]
        self.assertEqual(q16.encode_args(0x1000)[:6], (6, 3, 0x1000, (128, 100, 6), (256, 25600), (64, 128, 1)))
        self.assertEqual(al.TENSOR_MAP_DATA_TYPES, {"bf16": 9, "f16": 6, "f32": 7})
        # The encoder gets them through the driver, with the map's address first.
        fake = FakeEncoder()
        al.encode_tensor_map(fake, 0x4000, q, 0x7F0000001000, "Tma forward")
        self.assertEqual(fake.calls, [(0x4000,) + q.encode_args(0x7F0000001000)])

    def test_encoder_refusals_name_the_tensor(self):
        q = self.maps(self.prepare())[0]
        fake = FakeEncoder()
        with self.assertRaisesRegex(Error, r"^Tma forward: q: its data at 0x1008 does not start at a multiple of 16 bytes, "
                                           r"which cuTensorMapEncodeTiled needs for the tensor map of `q` \(bf16, dims \[128, 100, 6\], box \[64, 128, 1\]\); pass q.clone\(\)$"):
            al.encode_tensor_map(fake, 0x4000, q, 0x1008, "Tma forward")
        with self.assertRaisesRegex(Error, r"map's host memory at 0x4020 is not 64-byte aligned"):
            al.encode_tensor_map(fake, 0x4020, q, 0x1000, "Tma forward")
        self.assertEqual(fake.calls, [])
        with self.assertRaisesRegex(Error, r"^Tma forward: cuTensorMapEncodeTiled failed \(CUDA_ERROR_INVALID_VALUE\) for the tensor map "
                                           r"of `q` \(bf16, dims \[128, 100, 6\], box \[64, 128, 1\]\) at 0x1000, byte strides \[256, 25600\]$"):
            al.encode_tensor_map(FakeEncoder(result=1), 0x4000, q, 0x1000, "Tma forward")

    def test_plan_refusals(self):
        def with_map(**m):
            plan = _tma_plan()
            plan["launches"][0]["args"][-3]["tensor_map"].update(m)
            return plan

        cases = [
            (dict(buffer="x"), r"^Tma forward: launch aec_fwd_tma_wgmma_ws maps unknown buffer `x`$"),
            (dict(buffer="o"), r"maps `o`, which is not a 16-bit input \(it is an output of bf16\)"),
            (dict(buffer="row_outputs"), r"maps `row_outputs`, which is not a 16-bit input \(it is an output of f32\)"),
            (dict(buffer="slopes"), r"maps `slopes`, which is not a 16-bit input \(it is an input of f32\)"),
            (dict(box=[64, 0, 1]), r"tensor map of `q`: box \[64, 0, 1\]: expected 3 integers from 1 to 256"),
            (dict(box=[64, 257, 1]), r"box \[64, 257, 1\]: expected 3 integers from 1 to 256"),
            (dict(box=[64, 128]), r"box \[64, 128\]: expected 3 integers"),
            (dict(box=[64, 128.0, 1]), r"expected 3 integers"),
            (dict(box=[64, True, 1]), r"expected 3 integers"),
            (dict(box=[128, 128, 1]), r"box \[128, 128, 1\]: a row of 128 bf16 elements is 256 bytes, wider than the 128-byte swizzle"),
            (dict(dims=[128, "Sq"]), r"tensor map of `q`: dims \[128, 'Sq'\]: expected 3 size expressions"),
            (dict(dims=[128, "Sx", 1]), r"tensor map of `q`: dims\[1\]: size expression reads `Sx`, which the call does not bind"),
            (dict(dims=[128, "Sq", {"add": [1, 2]}]), r"dims\[2\]: malformed size expression"),
        ]
        for over, pattern in cases:
            with self.subTest(over=over):
                with self.assertRaisesRegex(Error, pattern):
                    al.Plan("Tma", with_map(**over))
        plan = _tma_plan()
        del plan["launches"][0]["args"][-1]["tensor_map"]["box"]
        with self.assertRaisesRegex(Error, r"malformed tensor_map argument .*expected buffer, dims and box"):
            al.Plan("Tma", plan)
        # The manifest's own plans pass: a variant's plan is checked when made.
        al.Plan("Tma", _tma_plan("f16"))

    def test_extent_errors_name_the_tensor(self):
        def with_dims(dims):
            plan = _tma_plan()
            plan["launches"][0]["args"][-3]["tensor_map"]["dims"] = dims
            return plan

        with self.assertRaisesRegex(Error, r"^Tma forward: launch aec_fwd_tma_wgmma_ws: q: tensor map dims \[Sq \* Sq, 1, 1\] = \[4900000000, 1, 1\]: "
                                           r"4900000000 is outside 1 to 2\^32 \(cuTensorMapEncodeTiled's limit\) for B=1, H=1, Hkv=1, Sq=70000, Skv=1$"):
            self.prepare(with_dims([{"mul": ["Sq", "Sq"]}, 1, 1]), inputs=_tma_inputs(b=1, h=1, sq=70000, skv=1))
        with self.assertRaisesRegex(Error, r"q: tensor map dims \[128, min\(Sq, 0\), B \* H\] = \[128, 0, 6\]: 0 is outside 1 to 2\^32"):
            self.prepare(with_dims([128, {"min": ["Sq", 0]}, {"mul": ["B", "H"]}]))
        with self.assertRaisesRegex(Error, r"q: tensor map dims \[128, Skv, B \* H\] = \[128, 177, 6\] cover 135936 elements, "
                                           r"more than the tensor's 76800 \(\[2, 3, 100, 128\]\)"):
            self.prepare(with_dims([128, "Skv", {"mul": ["B", "H"]}]), inputs=_tma_inputs(skv=177))
        with self.assertRaisesRegex(Error, r"q: tensor map dims \[100, Sq, B \* H\] = \[100, 100, 6\] give byte strides \[200, 20000\]; "
                                           r"cuTensorMapEncodeTiled needs multiples of 16 below 2\^40"):
            self.prepare(with_dims([100, "Sq", {"mul": ["B", "H"]}]))

    def test_hip_refuses_tensor_maps(self):
        with self.assertRaisesRegex(Error, r"launch aec_fwd_tma_wgmma_ws takes a CUDA tensor map of `q`, which HIP cannot launch"):
            self.prepare(hip=True)
        drv = al._HipDriver.__new__(al._HipDriver)
        with self.assertRaisesRegex(Error, "cannot be encoded through the HIP runtime"):
            al.encode_tensor_map(drv, 0x4000, self.maps(self.prepare())[0], 0x1000)

    def test_params_hold_aligned_maps_the_driver_class_encodes(self):
        # The CUDA driver class over a stand-in for libcuda whose
        # cuTensorMapEncodeTiled is a Python function: it checks what the
        # driver would get and writes a recognisable map.
        ct = al.ctypes
        u32p, u64p = ct.POINTER(ct.c_uint32), ct.POINTER(ct.c_uint64)
        proto = ct.CFUNCTYPE(ct.c_int, ct.c_void_p, ct.c_int, ct.c_uint32, ct.c_void_p, u64p, u64p, u32p, u32p,
                             ct.c_int, ct.c_int, ct.c_int, ct.c_int)
        seen = []

        def encode(out, data_type, rank, address, dims, strides, box, element_strides, interleave, swizzle, l2, oob):
            seen.append((out, data_type, rank, address, tuple(dims[:3]), tuple(strides[:2]), tuple(box[:3]),
                         tuple(element_strides[:3]), interleave, swizzle, l2, oob))
            ct.memmove(out, bytes(range(dims[1] % 128, dims[1] % 128 + 128)), 128)
            return 0

        class Lib:
            cuTensorMapEncodeTiled = proto(encode)

        drv = al._Driver.__new__(al._Driver)
        drv.lib = Lib()
        call = self.prepare()
        params, slots, maps = al._params(call.launches[0][4])
        self.assertEqual(len(params), 14)
        self.assertEqual([name for _, name in slots], ["q", "k", "v", "o", "row_outputs", "slopes"])
        self.assertEqual([arg.buffer for _, arg in maps], ["q", "k", "v"])
        addresses = {"q": 0x10000, "k": 0x20000, "v": 0x30000}
        for (address, arg), i in zip(maps, (11, 12, 13)):
            self.assertEqual(address % 64, 0)
            self.assertEqual(params[i], address)  # the parameter is the map, by value
            al.encode_tensor_map(drv, address, arg, addresses[arg.buffer], "Tma forward")
        self.assertEqual(seen[0], (maps[0][0], 9, 3, 0x10000, (128, 100, 6), (256, 25600), (64, 128, 1), (1, 1, 1), 0, 3, 2, 0))
        self.assertEqual(seen[2][3:7], (0x30000, (64, 77, 6), (128, 9856), (64, 128, 1)))
        self.assertEqual(ct.string_at(params[11], 128), bytes(range(100, 228)))
        self.assertEqual(ct.string_at(params[12], 128), bytes(range(77, 205)))
        self.assertEqual(ct.c_int32.from_address(params[9]).value, 100)  # the sizes stay in their slots
        # A driver without the encoder (older than CUDA 12.0): a clear error.
        old = al._Driver.__new__(al._Driver)
        old.lib = object()
        with self.assertRaisesRegex(Error, r"libcuda.so.1\) has no cuTensorMapEncodeTiled.*CUDA 12.0 or newer"):
            al.encode_tensor_map(old, maps[0][0], maps[0][1], 0x10000)


class HipArchitectures(unittest.TestCase):
    def test_gcn_arch_names(self):
        self.assertEqual(al.hip_arch("gfx942:sramecc+:xnack-"), "gfx942")
        self.assertEqual(al.hip_arch("gfx90a"), "gfx90a")
        for bad in ("", None, "sm_90a"):
            with self.assertRaisesRegex(Error, "cannot tell the AMD GPU's architecture"):
                al.hip_arch(bad)
        self.assertTrue(al.is_hip_arch("gfx942"))
        self.assertFalse(al.is_hip_arch("sm_90a"))


HIP_LIBRARY = os.environ.get("AEC_TEST_HIP_LIBRARY")
FAKE_HIP = os.environ.get("AEC_TEST_FAKE_HIP")
FAKE_LOG = os.environ.get("AEC_FAKE_HIP_LOG")


@unittest.skipUnless(HIP_LIBRARY and FAKE_HIP and FAKE_LOG, "set AEC_TEST_HIP_LIBRARY, AEC_TEST_FAKE_HIP, AEC_FAKE_HIP_LOG")
class HipBuilds(unittest.TestCase):
    """A library for mi250 and mi300x, run through the HIP driver class over
    the test double of the HIP runtime."""

    @classmethod
    def setUpClass(cls):
        cls.m = al.read_manifest(HIP_LIBRARY)
        cls.softmax = next(v for v in cls.m["variants"] if v["name"] == "Softmax")

    def test_code_objects_are_chosen_by_gfx_arch(self):
        self.assertEqual(al.built_archs(self.m), ["gfx90a", "gfx942"])
        for arch in ("gfx90a", "gfx942"):
            al.check_arch(self.m, arch)
            for pass_name in ("forward", "backward"):
                record, co = al.select_kernel(self.softmax, pass_name, arch)
                self.assertTrue(co.startswith("kernels/") and co.endswith(f"_{arch}.co"), co)
                self.assertIsNone(al.backward_unavailable(self.softmax, arch))
        with self.assertRaisesRegex(Error, r"no kernels for sm_90a.*it has: gfx90a, gfx942"):
            al.check_arch(self.m, "sm_90a", (9, 0))
        bare = copy.deepcopy(self.m)
        for v in bare["variants"]:
            for k in v["kernels"]:
                for b in k.get("builds") or []:
                    b["code_object"] = None
        with self.assertRaisesRegex(Error, "gfx942 kernels but no HIP code objects .*without the HIP compiler"):
            al.check_arch(bare, "gfx942")
        with self.assertRaisesRegex(Error, "Softmax forward: the library has no gfx942 HIP code object"):
            al.select_kernel(bare["variants"][0], "forward", "gfx942")
        self.assertIn("without the HIP compiler", al.backward_unavailable(bare["variants"][0], "gfx942"))

    def test_hip_grid_limit(self):
        record, _ = al.select_kernel(self.softmax, "backward", "gfx942")
        plan = al.Plan("Softmax", record["plan"])
        # The backward's last launch has a grid of B*H*Sq*128/256 blocks of
        # 256 threads: 2^32 threads along x at B*H*Sq = 2^25.
        big = dict(q=info((1, 1 << 10, 1 << 15, 128)), k=info((1, 1 << 10, 64, 128)), v=info((1, 1 << 10, 64, 128)))
        big.update(o=info((1, 1 << 10, 1 << 15, 128)), row_outputs=info((3, 1, 1 << 10, 1 << 15), "f32"))
        big.update(dout=info((1, 1 << 10, 1 << 15, 128)))
        plan.prepare(big, sms=304)  # within CUDA's limits
        with self.assertRaisesRegex(Error, r"beyond HIP's limit \(at most 2\^32 - 1 threads along each dimension\)"):
            plan.prepare(big, sms=304, hip=True)

    def test_driver_loads_and_launches_through_the_hip_runtime(self):
        record, co = al.select_kernel(self.softmax, "forward", "gfx942")
        plan = al.Plan("Softmax", record["plan"])
        shapes = dict(q=(2, 3, 77, 128), k=(2, 3, 100, 128), v=(2, 3, 100, 128))
        call = plan.prepare({n: info(s) for n, s in shapes.items()}, sms=304, hip=True)
        drv = al._HipDriver(FAKE_HIP)
        addresses = {"q": 0x10000, "k": 0x20000, "v": 0x30000, "o": 0x40000, "row_outputs": 0x50000}
        open(FAKE_LOG, "w").close()
        os.environ["AEC_FAKE_HIP_ARGS"] = "5:5"
        try:
            with drv.current(drv.primary_context(0)):
                with open(os.path.join(HIP_LIBRARY, co), "rb") as fh:
                    module = drv.load_module(fh.read(), co)
                for entry, grid, threads, smem, args in call.launches:
                    fn = drv.get_function(module, entry, smem)
                    params, slots, maps = al._params(args)
                    self.assertEqual(maps, [])  # HIP plans have no tensor maps
                    for slot, name in slots:
                        slot.value = addresses[name]
                    drv.check(drv.launch(fn, grid, threads, smem, None, params), f"{drv.LAUNCH} {entry}")
        finally:
            del os.environ["AEC_FAKE_HIP_ARGS"]
        with open(FAKE_LOG) as fh:
            logged = fh.read().splitlines()
        self.assertEqual(
            logged,
            [
                f"launch {record['entry']} grid 2 3 2 block 256 1 1 smem 0 args "
                "p10000 p20000 p30000 p40000 p50000 i2 i3 i3 i77 i100"
            ],
        )
        # The runtime's refusals come back by name.
        with open(os.path.join(HIP_LIBRARY, co.replace("_gfx942", "_gfx90a")), "rb") as fh:
            other = fh.read()
        with self.assertRaisesRegex(RuntimeError, "hipModuleLoadData .*_gfx90a.co: hipErrorNoBinaryForGpu"):
            drv.load_module(other, co.replace("_gfx942", "_gfx90a"))
        with self.assertRaisesRegex(RuntimeError, "hipModuleGetFunction aec_missing: hipErrorNotFound"):
            drv.get_function(module, "aec_missing", 0)
        with self.assertRaisesRegex(Error, "more than the 65536 a HIP kernel may use"):
            drv.get_function(module, record["entry"], 70000)
        # `current` switches the device for a while and back.
        cur = al.ctypes.c_int()
        with drv.current(1):
            drv.check(drv.lib.hipGetDevice(al.ctypes.byref(cur)), "hipGetDevice")
            self.assertEqual(cur.value, 1)
        drv.check(drv.lib.hipGetDevice(al.ctypes.byref(cur)), "hipGetDevice")
        self.assertEqual(cur.value, 0)
        with self.assertRaisesRegex(Error, "the HIP runtime \\(libamdhip64.so\\) cannot be loaded"):
            al._HipDriver("/nonexistent/libamdhip64.so")


if __name__ == "__main__":
    unittest.main()
