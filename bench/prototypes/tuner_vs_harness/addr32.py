"""Hand patch (bench/NOTES.md session 70 item 6): a generated warp-specialised forward with its mbarrier and TMA/stage shared addresses as a 32-bit base plus offsets, so NVRTC compiles it as nvcc does. Usage: python addr32.py <generated .cu>."""
import re, sys
p = sys.argv[1]; s = open(p).read()
def rep(a, b, n=None):
    global s
    c = s.count(a)
    assert c >= 1 and (n is None or c == n), (a, c)
    s = s.replace(a, b)
# 32-bit overloads of the barrier and TMA helpers.
anchor = "// Brings the box at (c0, c1, c2) of the tensor"
rep(anchor, """__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
    unsigned done = 0;
    while (!done) {
        asm volatile(
            "{\\n.reg .pred p;\\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\\nselp.u32 %0, 1, 0, p;\\n}\\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    }
}
__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void tma_load_3d(unsigned dst, const TmaMap& map, int c0, int c1, int c2, unsigned bar) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, { %2, %3, %4 }], [%5];\\n"
        ::"r"(dst), "l"(reinterpret_cast<unsigned long long>(&map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
        : "memory");
}
""" + anchor, 1)
decl = "    __shared__ __align__(8) unsigned long long bar_full[STAGES], bar_empty[STAGES], bar_q, bar_q_free;\n"
rep(decl, decl + "    const unsigned u_bar_full = smem_u32(bar_full), u_bar_empty = smem_u32(bar_empty), u_bar_q = smem_u32(&bar_q), u_bar_q_free = smem_u32(&bar_q_free);\n    const unsigned u_sQ = smem_u32(sQ), u_sK = smem_u32(sK), u_sV = smem_u32(sV);\n", 1)
s = re.sub(r"&bar_(full|empty)\[([a-z_]+)\]", r"(u_bar_\1 + (\2) * 8u)", s)
s = s.replace("&bar_q_free", "u_bar_q_free").replace("&bar_q,", "u_bar_q,").replace("&bar_q)", "u_bar_q)")
s = s.replace("u_bar_q = smem_u32(u_bar_q), u_bar_q_free = smem_u32(u_bar_q_free);", "u_bar_q = smem_u32(&bar_q), u_bar_q_free = smem_u32(&bar_q_free);")
s = re.sub(r"tma_load_3d\((s[KVQ]) \+ ([^,]*),", r"tma_load_3d(u_\1 + 2u * (\2),", s)
rep("smem_u32(sK + cur * BN * SQS)", "(u_sK + 2u * (cur * BN * SQS))")
rep("smem_u32(sQ) + (wr / 4)", "u_sQ + (wr / 4)")
rep("#define V_SMEM(stage) (smem_u32(sV + (stage) * BN * SVS)", "#define V_SMEM(stage) (u_sV + 2u * ((stage) * BN * SVS)", 1)
open(p, "w").write(s)
print("left: &bar_", s.count("&bar_"), "smem_u32(s", s.count("smem_u32(s"))
