"""Patches a generated warp-specialised forward so one producer warp walks
the tiles and its lane 0 loads Q, K and V by TMA (a measurement prototype;
see README.md here): patch.py IN.cu OUT.cu."""
import re, sys
src, dst = sys.argv[1], sys.argv[2]
s = open(src).read()
# 1. Tensor-map parameters.
s = s.replace("    int B, int H, int Hkv, int Sq, int Skv) {\n    extern __shared__",
              "    int B, int H, int Hkv, int Sq, int Skv,\n    const __grid_constant__ Tmap tm_q, const __grid_constant__ Tmap tm_k, const __grid_constant__ Tmap tm_v) {\n    extern __shared__", 1)
helpers = r'''
struct __align__(64) Tmap { unsigned long long w[16]; };
__device__ __forceinline__ void mbar_expect_tx(unsigned long long* bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
// One box of 64 columns x ROWS rows of [n][rows][cols] at (c0, r0, n) into dst.
__device__ __forceinline__ void tma3(void* dst, const Tmap& tm, int c0, int r0, int n, unsigned long long* bar) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n"
                 :: "r"(smem_u32(dst)), "l"(reinterpret_cast<unsigned long long>(&tm)), "r"(c0), "r"(r0), "r"(n), "r"(smem_u32(bar)) : "memory");
}
'''
i = s.index('extern "C" __global__')
s = s[:i] + helpers + s[i:]
# 2. One arrival (with the transaction bytes) per phase of bar_q and bar_full.
s = s.replace("mbar_init(&bar_q, NPWARPS * WARP);", "mbar_init(&bar_q, 1);")
s = s.replace("mbar_init(&bar_full[st], NPWARPS * WARP);", "mbar_init(&bar_full[st], 1);")
# 3. Producer: elected thread only.
s = s.replace('''        const int ptid = tid - NWARPS * WARP;
        int ring = 0, lt = 0;  // K/V blocks and tiles loaded so far''', '''        const int ptid = tid - NWARPS * WARP;
        if (ptid >= WARP) return;  // one warp walks the tiles (warp-wide classification), lane 0 issues
        int ring = 0, lt = 0;  // K/V blocks and tiles loaded so far''', 1)
old_q = '''        load_tile_sw128<BM, DQK, NPWARPS * WARP>(sQ, qg, m0, n_rows, ptid);
        mbar_arrive_cp_async(&bar_q);'''
new_q = '''        if (ptid == 0) {
        mbar_expect_tx(&bar_q, BM * DQK * 2);
#pragma unroll
        for (int p = 0; p < DQK / 64; ++p) tma3(sQ + p * BM * 64, tm_q, p * 64, m0, b * H + h, &bar_q);
        }'''
assert old_q in s
s = s.replace(old_q, new_q)
old_kv = '''            load_tile_sw128<BN, DQK, NPWARPS * WARP>(sK + st * BN * SQS, kg, n0, Skv, ptid, KV_ROWS);
            load_tile_sw128<BN, DV, NPWARPS * WARP, DVG>(sV + st * BN * SVS, vg, n0, Skv, ptid, KV_ROWS);
            mbar_arrive_cp_async(&bar_full[st]);'''
new_kv = '''            if (ptid == 0) {
            mbar_expect_tx(&bar_full[st], BN * (DQK + DV) * 2);
#pragma unroll
            for (int p = 0; p < DQK / 64; ++p) tma3(sK + st * BN * SQS + p * BN * 64, tm_k, p * 64, n0, b * Hkv + hk, &bar_full[st]);
#pragma unroll
            for (int p = 0; p < DV / 64; ++p) tma3(sV + st * BN * SVS + p * BN * 64, tm_v, p * 64, n0, b * Hkv + hk, &bar_full[st]);
            }'''
assert old_kv in s, "kv"
s = s.replace(old_kv, new_kv)
open(dst, "w").write(s)
print("patched", dst)
