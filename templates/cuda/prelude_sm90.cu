// Hopper (sm_90a) helpers: 128-byte-swizzled shared-memory tiles and the
// warpgroup MMA protocol (included after prelude.cu; needs elem_t, NT).
//
// A tile of ROWS x COLS 16-bit elements (COLS a multiple of 64) is stored as
// COLS / 64 panels of ROWS x 64; a panel row is 128 bytes, and within each
// 1024-byte atom of 8 rows the 16-byte chunk c of row r lives at chunk
// c ^ (r % 8). Panels start at 1024-byte boundaries. This is the layout
// `wgmma` reads through a descriptor with 128-byte swizzling.

// Element offset of (r, c) in such a tile.
template <int ROWS>
__device__ __forceinline__ int sw128_index(int r, int c) {
    // (In unsigned arithmetic: r and c are never negative, and as ints the
    // compiler kept sign fix-ups of every column's quotient and remainder,
    // hoisted out of loops, where they took registers or spilled.)
    const unsigned ur = r, uc = c;
    return (int)((uc / 64) * (ROWS * 64) + ur * 64 + ((((uc % 64) / 8) ^ (ur % 8)) * 8) + uc % 8);
}

// Copies rows [row0, row0 + ROWS) of a [rows, COLS] matrix (rows GS elements
// apart in global memory) into a swizzled
// tile with NTH threads (`tid` in [0, NTH)); rows past `limit` are
// zero-filled. Each thread owns one 16-byte column chunk of a panel and rows
// tid / 8 + k * (NTH / 8): its row stays the same modulo 8, so the swizzle is
// fixed and every copy is the thread's base address plus a compile-time
// offset (a few instructions per 16 bytes: this loop is the producer
// warpgroup's whole job). A warp reads 4 rows x 128 contiguous bytes.
template <int ROWS, int COLS, int NTH = NT, int GS = COLS, typename Map = Rows>
__device__ __forceinline__ void load_tile_sw128(elem_t* s, const elem_t* g, int row0, int limit, int tid, Map map = Map()) {
    constexpr int RSTEP = NTH / 8;  // rows per pass
    static_assert(NTH % 64 == 0 && ROWS % RSTEP == 0 && COLS % 64 == 0, "tile not covered evenly");
    const int c8 = tid % 8, r0 = tid / 8;
    const unsigned dst0 = smem_u32(s) + r0 * 128 + ((c8 ^ (r0 % 8)) * 16);
    static_assert(Map::CONTIGUOUS || ROWS <= (WARP - 1) * 16, "paged tile spans too many pages");
    const auto rows = map.template tile<ROWS>(row0, limit);
    if (rows.one_page) {
        // Every row at a compile-time offset from the thread's first; rows
        // past the end read that one (in bounds: the page, or the matrix)
        // and write zeros.
        const elem_t* src0 = g + (rows.base + row0 + r0) * GS + c8 * 8;
#pragma unroll
        for (int k = 0; k < ROWS / RSTEP; ++k) {
            const int bytes = row0 + r0 + k * RSTEP < limit ? 16 : 0;
            const elem_t* src = bytes ? src0 + k * RSTEP * GS : src0;
#pragma unroll
            for (int p = 0; p < COLS / 64; ++p)
                cp_async16(dst0 + p * (ROWS * 128) + k * RSTEP * 128, src + p * 64, bytes);
        }
    } else {
        // A paged tile over several pages shuffles: every lane looks a row
        // up on every pass, rows past the end the tile's first (in bounds).
#pragma unroll
        for (int k = 0; k < ROWS / RSTEP; ++k) {
            const int gr = row0 + r0 + k * RSTEP;
            const int bytes = gr < limit ? 16 : 0;
            const elem_t* src = g + rows(bytes ? gr : row0) * GS + c8 * 8;
#pragma unroll
            for (int p = 0; p < COLS / 64; ++p)
                cp_async16(dst0 + p * (ROWS * 128) + k * RSTEP * 128, src + p * 64, bytes);
        }
    }
}

// Stores four 8 x 8 matrices of 16-bit elements from mma fragments (thread
// t holds row t / 4, columns 2 (t % 4) and 2 (t % 4) + 1 of matrix j in r_j);
// lane l gives the address of row l % 8 of matrix l / 8 (16 contiguous bytes).
__device__ __forceinline__ void stmatrix_x4(unsigned addr, unsigned r0, unsigned r1, unsigned r2, unsigned r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], { %1, %2, %3, %4};\n" ::"r"(addr), "r"(r0), "r"(r1),
                 "r"(r2), "r"(r3)
                 : "memory");
}

// The same, each matrix stored transposed: lane l gives the address of
// column l % 8 of matrix l / 8 (its 8 elements contiguous).
__device__ __forceinline__ void stmatrix_x4_trans(unsigned addr, unsigned r0, unsigned r1, unsigned r2, unsigned r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], { %1, %2, %3, %4};\n" ::"r"(addr), "r"(r0), "r"(r1),
                 "r"(r2), "r"(r3)
                 : "memory");
}

// Matrix descriptor of a swizzled operand starting at shared address `addr`:
// `lbo` is the byte distance between 64-column panels (used when the operand
// is N-major), 1024 the distance between 8-row groups.
__device__ __forceinline__ unsigned long long sw128_desc(unsigned addr, unsigned lbo) {
    return (unsigned long long)((addr & 0x3FFFFu) >> 4) | ((unsigned long long)((lbo & 0x3FFFFu) >> 4) << 16) |
           ((unsigned long long)(1024u >> 4) << 32) | (1ull << 62);
}
// sw128_desc(base + offset, lbo) for an `offset` that is a multiple of 16:
// the base's fields plus offset / 16 in the start-address field (shared
// addresses stay below 256 KiB: no carry out of it). A GEMM's k-steps share
// the base's part, and each step's descriptor is one add on the uniform
// datapath instead of a mask, a shift and an or. (The backward's kernels:
// in the forward, with fewer instructions, it measured 1-2% slower, and
// ALiBi's tiles with Q in registers spilled; bench/NOTES.md session 59.)
__device__ __forceinline__ unsigned long long sw128_desc_at(unsigned base, unsigned offset, unsigned lbo) {
    const unsigned lo = (((base & 0x3FFFFu) >> 4) | (((lbo & 0x3FFFFu) >> 4) << 16)) + (offset >> 4);
    return ((unsigned long long)((1024u >> 4) | (1u << 30)) << 32) | lo;
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait1() { asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory"); }

// Keeps registers an in-flight wgmma reads (its A fragments) from being
// reused before the wait that retires it.
template <int N>
__device__ __forceinline__ void fence_regs(unsigned (&a)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
        for (int c = 0; c < 4; ++c) asm volatile("" : "+r"(a[i][c])::"memory");
}

// The same as a last use only (the values die here): for fragments whose
// wait is in a later loop iteration, where a "+r" fence would keep them live
// through the iterations that do not redefine them.
template <int N>
__device__ __forceinline__ void last_use_regs(const unsigned (&a)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
        for (int c = 0; c < 4; ++c) asm volatile("" ::"r"(a[i][c]) : "memory");
}

// Makes this thread's shared-memory writes (plain stores and cp.async)
// visible to the async proxy that wgmma reads through.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// mbarriers (shared-memory arrival counters with phases) for the
// producer/consumer pipeline of the warp-specialised kernels. Each helper
// takes the barrier's shared-memory address (smem_at(bars, i), smem_u32(&bar)).
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// The arrival happens when all of this thread's earlier cp.async copies have
// landed (counted as one of the barrier's expected arrivals).
__device__ __forceinline__ void mbar_arrive_cp_async(unsigned bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// Waits until the barrier's phase with this parity has completed.
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
    unsigned done = 0;
    while (!done) {
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    }
}
// A CUDA tensor map (CUtensorMap: 128 opaque bytes that the launcher encodes
// with cuTensorMapEncodeTiled), passed by value as a __grid_constant__
// parameter so the copy engine reads it from the parameter space.
struct __align__(64) TmaMap {
    unsigned long long words[16];
};
// One arrival that also expects `bytes` of copies to land (the TMA copies
// count down the barrier's transaction bytes as they complete).
__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// A TMA copy of the box at coordinates (c0, c1, c2), innermost first, of the
// 3-D tensor `map` describes into shared memory at address `dst` (1024-byte
// aligned for the 128-byte swizzle), completing on the barrier at `bar`.
// Elements outside the tensor read as zero and still count towards the
// transaction bytes.
__device__ __forceinline__ void tma_load_3d(unsigned dst, const TmaMap& map, int c0, int c1, int c2, unsigned bar) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, { %2, %3, %4 }], [%5];\n"
        ::"r"(dst), "l"(reinterpret_cast<unsigned long long>(&map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
        : "memory");
}
// The same box into shared address `dst` of every CTA of the cluster in
// `cta_mask`, each copy completing on the barrier at `bar` in its own CTA
// (the same offsets in each): a cluster pair's K/V multicast.
__device__ __forceinline__ void tma_load_3d_multicast(unsigned dst, const TmaMap& map, int c0, int c1, int c2, unsigned bar,
                                                      unsigned short cta_mask) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, { %2, %3, %4 }], [%5], %6;\n"
        ::"r"(dst), "l"(reinterpret_cast<unsigned long long>(&map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar), "h"(cta_mask)
        : "memory");
}
// This CTA's rank in its cluster.
__device__ __forceinline__ unsigned cluster_ctarank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}
// The address of this CTA's shared `addr` in CTA `rank` of the cluster.
__device__ __forceinline__ unsigned cluster_map(unsigned addr, unsigned rank) {
    unsigned r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
    return r;
}
// An arrival on a barrier of another CTA of the cluster (`cluster_map`'s
// address), releasing this thread's prior accesses at cluster scope.
__device__ __forceinline__ void mbar_arrive_cluster(unsigned remote_bar) {
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(remote_bar) : "memory");
}
// mbar_wait with acquire at cluster scope: for a phase that arrivals from
// another CTA of the cluster complete (their release.cluster pairs with it).
__device__ __forceinline__ void mbar_wait_cluster(unsigned bar, unsigned parity) {
    unsigned done = 0;
    while (!done) {
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    }
}
// Makes this CTA's mbarrier initialisations visible to the cluster (before
// the cluster barrier after which other CTAs may arrive on them).
__device__ __forceinline__ void fence_mbar_init_cluster() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// Every thread of every CTA of the cluster.
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// Brings the box at (c0, c1, c2) of the tensor `map` describes into L2 (no
// shared memory, no barrier): a later tma_load_3d of it then reads L2.
__device__ __forceinline__ void tma_prefetch_3d(const TmaMap& map, int c0, int c1, int c2) {
    asm volatile("cp.async.bulk.prefetch.tensor.3d.L2.global.tile [%0, { %1, %2, %3 }];\n"
                 ::"l"(reinterpret_cast<unsigned long long>(&map)), "r"(c0), "r"(c1), "r"(c2)
                 : "memory");
}
// Named barrier `id` (1..15; 0 is __syncthreads) of `threads` threads.
__device__ __forceinline__ void named_bar_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Adds `bytes` (a multiple of 16) of f32 at shared `src` into global `dst`
// (both 16-byte aligned) on the bulk-copy engine, in this thread's bulk group.
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, const float* src, unsigned bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
                 ::"l"(dst), "r"(smem_u32(src)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// This thread's bulk operations have read their shared memory.
__device__ __forceinline__ void bulk_wait_read0() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
// Arrival at named barrier `id` without waiting (its release of this thread's
// prior writes pairs with the acquire of the threads that sync on it).
__device__ __forceinline__ void named_bar_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// A barrier for the 128 threads of one warpgroup (ids 1.. ; 0 is __syncthreads).
__device__ __forceinline__ void warpgroup_sync(int id) {
    asm volatile("bar.sync %0, 128;\n" ::"r"(id) : "memory");
}
