// Shared helpers of the sm_80-class templates (included; needs elem_t, NT, PAD).

// Per-block timeline marks (bench/timeline.py): built with -DAEC_TIMELINE,
// thread 0 of each of the first AEC_TIMELINE_BLOCKS blocks records
// %globaltimer (ns) at mark k in aec_timeline[block * 8 + k] and its SM in
// slot 7; otherwise AEC_MARK is nothing. Which marks a kernel has, and
// where, is the template's business (parallel_fwd.cu lists its own).
#ifdef AEC_TIMELINE
#define AEC_TIMELINE_BLOCKS 65536
__device__ unsigned long long aec_timeline[AEC_TIMELINE_BLOCKS * 8];
__device__ __forceinline__ void aec_mark(int k) {
    if (threadIdx.x != 0) return;
    const unsigned block = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
    if (block >= AEC_TIMELINE_BLOCKS) return;
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    aec_timeline[block * 8 + k] = t;
    if (k == 0) {
        unsigned sm;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        aec_timeline[block * 8 + 7] = sm;
    }
}
#define AEC_MARK(k) aec_mark(k)
// Per-tile marks of the warp-specialised forward (bench/timeline.py
// --tiles): for each of its first AEC_TILE_SLOTS tiles, block b records at
// slot k of tile t, aec_tile_timeline[(b * AEC_TILE_SLOTS + t) * 8 + k],
// %globaltimer (AEC_TILE_MARK: thread 0; AEC_TILE_STAMP: the caller's
// thread) or a value (AEC_TILE_VALUE, thread 0). The template lists its
// slots.
#define AEC_TILE_BLOCKS 1024
#define AEC_TILE_SLOTS 64
__device__ unsigned long long aec_tile_timeline[AEC_TILE_BLOCKS * AEC_TILE_SLOTS * 8];
__device__ __forceinline__ unsigned aec_smid() {
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    return sm;
}
__device__ __forceinline__ void aec_tile_put(int tile, int k, unsigned long long v) {
    if (blockIdx.x < AEC_TILE_BLOCKS && tile < AEC_TILE_SLOTS)
        aec_tile_timeline[((unsigned long long)blockIdx.x * AEC_TILE_SLOTS + tile) * 8 + k] = v;
}
__device__ __forceinline__ unsigned long long aec_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
#define AEC_TILE_STAMP(t, k) aec_tile_put((t), (k), aec_now())
#define AEC_TILE_MARK(t, k) \
    do {                     \
        if (threadIdx.x == 0) AEC_TILE_STAMP(t, k); \
    } while (0)
#define AEC_TILE_VALUE(t, k, v) \
    do {                        \
        if (threadIdx.x == 0) aec_tile_put((t), (k), (v)); \
    } while (0)
#else
#define AEC_MARK(k)
#define AEC_TILE_STAMP(t, k)
#define AEC_TILE_MARK(t, k)
#define AEC_TILE_VALUE(t, k, v)
#endif
// The lane index read from its special register where it is used. A value
// derived from threadIdx.x at the kernel's start and used again after a long
// loop is held (or spilled) across the loop; ptxas does not recompute it.
__device__ __forceinline__ int lane_id() {
    int lane;
    asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
    return lane;
}

// The thread's index in the block and the block's in the grid, read
// likewise where they are needed (volatile: ptxas neither hoists the read nor
// keeps an earlier value alive across a loop).
#define AEC_SPECIAL_REGISTER(fn, reg)                       \
    __device__ __forceinline__ unsigned fn() {              \
        unsigned r;                                         \
        asm volatile("mov.u32 %0, %%" reg ";" : "=r"(r));   \
        return r;                                           \
    }
AEC_SPECIAL_REGISTER(thread_index, "tid.x")
AEC_SPECIAL_REGISTER(block_index_x, "ctaid.x")
AEC_SPECIAL_REGISTER(block_index_y, "ctaid.y")
AEC_SPECIAL_REGISTER(block_index_z, "ctaid.z")
#undef AEC_SPECIAL_REGISTER

__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
// The shared-memory address of base[index], the offset added in 32 bits.
// Addresses handed to ldmatrix, cp.async, MMA descriptors, mbarriers and
// TMA are formed this way, never by smem_u32 of base + index: NVRTC (what the
// runtime compiles with) does that pointer arithmetic in 64 bits and
// narrows the sum, nvcc in 32; the 64-bit form cost NVRTC builds up to 10%
// (bench/NOTES.md session 70 item 6, session 71 item 1). (A stage's tile
// kept as a pointer, such as sKc, still costs one 64-bit add per stage.)
template <typename T>
__device__ __forceinline__ unsigned smem_at(const T* base, unsigned index) {
    return smem_u32(base) + index * static_cast<unsigned>(sizeof(T));
}

// (The 128-byte L2 prefetch hint: decoding 1.4% faster on an H100, the
// other kernels unchanged; bench/NOTES.md.)
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::); }

// Waits until at most N of this thread's committed copy groups are pending.
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldmatrix_x4(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 { %0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 { %0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

// d += a · b for one m16n8k16 tile, f32 accumulators.
__device__ __forceinline__ void mma16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.{{ sp.mma_type }}.{{ sp.mma_type }}.f32 { %0, %1, %2, %3}, { %4, %5, %6, %7}, { %8, %9}, { %0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ float fast_tanh(float x) {
    float y;
    asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ unsigned pack2(float lo, float hi) {
    {{ sp.pack2_body }}
}

__device__ __forceinline__ float to_f32(elem_t x) { return {{ sp.to_f32 }}(x); }
__device__ __forceinline__ elem_t from_f32(float x) { return {{ sp.from_f32 }}(x); }

// The four lanes of a quad hold one row of an mma accumulator tile: the
// row_lanes_* helpers combine them (the HIP prelude defines its own).
__device__ __forceinline__ float row_lanes_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    x += __shfl_xor_sync(0xffffffffu, x, 2);
    return x;
}
__device__ __forceinline__ float row_lanes_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
    return x;
}
__device__ __forceinline__ bool row_lanes_any(bool x) {
    int v = x ? 1 : 0;
    v |= __shfl_xor_sync(0xffffffffu, v, 1);
    v |= __shfl_xor_sync(0xffffffffu, v, 2);
    return v != 0;
}

// One butterfly stage across the quad: lanes with bit M of t4 set trade their
// words at indices without bit M for the partner's words at indices with it.
template <int M>
__device__ __forceinline__ void quad_exchange(unsigned (&w)[4], int t4) {
    const bool hi = (t4 & M) != 0;
#pragma unroll
    for (int i = 0; i < 4; ++i)
        if (!(i & M)) {
            const unsigned x = __shfl_xor_sync(0xffffffffu, hi ? w[i] : w[i | M], M);
            if (hi) w[i] = x;
            else w[i | M] = x;
        }
}

// A 16-byte store to global memory (`p` 16-byte aligned). Written out: NVVM
// splits a plain uint4 store into four 4-byte ones where the pointer
// arithmetic hides the alignment (seen with a 32-bit column offset).
__device__ __forceinline__ void store16(void* p, uint4 v) {
    asm volatile("st.global.v4.b32 [%0], { %1, %2, %3, %4};\n" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}

// Transposes a 4 x 4 matrix of words held one row per lane of a quad: lane t
// starts with row t and ends with column t.
__device__ __forceinline__ void quad_transpose(unsigned (&w)[4], int t4) {
    quad_exchange<2>(w, t4);
    quad_exchange<1>(w, t4);
}

// Where row r of a tile's source lives, in rows of GS elements from its base:
// row r itself (a contiguous matrix), or in a paged KV cache the row's page
// (from the sequence's block-table row; pages of 2^shift rows, `page_rows`
// apart) and its place in the page. A loader asks the map for one tile's
// rows first (`tile<ROWS>`). A tile inside one page is contiguous there:
// `one_page`, row r at `base + r`, addressed like a contiguous tile. Other
// paged tiles read each of their pages' table entries once, one per lane,
// and every row takes its page from that lane by a shuffle. (Reading the
// table per row put a dependent load before every copy, and the per-row
// address arithmetic cost the one-warp decoding loop issue slots: long paged
// decodes ran 13-21% slower, bench/NOTES.md.) All lanes of every warp that
// loads must call `tile` and the row map together.
struct Rows {
    static constexpr bool CONTIGUOUS = true;
    static constexpr bool one_page = true;
    static constexpr long long base = 0;
    template <int ROWS>
    __device__ __forceinline__ Rows tile(int, int) const { return *this; }
    __device__ __forceinline__ long long operator()(int r) const { return r; }
};
struct PagedTileRows {
    int page;       // this lane's page: the tile's first page + lane
    int first;      // the tile's first page
    int shift;
    long long page_rows;
    bool one_page;  // all the tile's rows in the first page, at base + r
    long long base;
    __device__ __forceinline__ long long operator()(int r) const {
        const int p = __shfl_sync(0xffffffffu, page, (r >> shift) - first);
        return (long long)p * page_rows + (r & ((1 << shift) - 1));
    }
};
struct PagedRows {
    static constexpr bool CONTIGUOUS = false;
    const int* pages;
    int shift;
    long long page_rows;
    // Rows [row0, limit) are the sequence's; pages past the last of them are
    // not read (the host checked only the entries a sequence reads).
    template <int ROWS>
    __device__ __forceinline__ PagedTileRows tile(int row0, int limit) const {
        const int first = row0 >> shift, p = first + (int)(threadIdx.x % WARP);
        const int page = (p << shift) < limit ? pages[p] : 0;
        const int page0 = __shfl_sync(0xffffffffu, page, 0);
        const long long base = (long long)page0 * page_rows + (row0 & ((1 << shift) - 1)) - row0;
        return {page, first, shift, page_rows, ((row0 + ROWS - 1) >> shift) == first, base};
    }
};

// Shared-memory tile layouts (a template picks with TILE_XOR_ROWS before
// including this file). Padded: rows of COLS + PAD elements, which ldmatrix
// reads without bank conflicts. XOR rows (COLS a multiple of 64): unpadded
// rows whose 16-byte chunks are permuted within each 128 bytes by the row
// index mod 8, also conflict-free — and every 128 bytes of a global row land
// in one 128-byte segment of shared memory. With a 16-byte pad they straddle
// two, and cp.async then requests each straddling L2 line twice (H200: 1.5x
// the L2 sectors, 48% L2 hits, and a streaming read 5.7% slower; bench/NOTES.md).
#ifndef TILE_XOR_ROWS
#define TILE_XOR_ROWS 0
#endif
template <int COLS>
__host__ __device__ constexpr bool tile_xor_rows() {
    return TILE_XOR_ROWS && COLS % 64 == 0;
}
// Elements from one row of a tile to the next.
template <int COLS>
__host__ __device__ constexpr int tile_stride() {
    return tile_xor_rows<COLS>() ? COLS : COLS + PAD;
}
// Where element (r, c) of a tile is (c of a whole 16-byte chunk stays in it).
template <int COLS>
__device__ __forceinline__ int tile_offset(int r, int c) {
    if constexpr (tile_xor_rows<COLS>()) {
        const int ch = c >> 3;
        return r * COLS + (((ch ^ r) & 7) | (ch & ~7)) * 8 + (c & 7);
    } else {
        return r * (COLS + PAD) + c;
    }
}

// ldmatrix addresses of 16-byte chunk pairs 2j, 2j + 1 (j = 0..3) of each
// 128 bytes of a row, from `base` (the tile's shared-memory address) and
// `off`, the element offset of the lane's first chunk c0 (0 or 1): with XOR
// rows the pair's place depends on the row (bits 4-6 of the offset), so
// each lane keeps four addresses; chunk pair kk of the row is then
// `x[kk % 4] + tile_chunk_step(kk)`, a constant offset the load folds in
// (padded rows the same way, the four addresses 32 bytes apart).
template <int COLS>
__device__ __forceinline__ void tile_chunks(unsigned (&x)[4], unsigned base, int off) {
    const unsigned lane_off = off * sizeof(elem_t);
#pragma unroll
    for (int j = 0; j < 4; ++j)
        x[j] = base + (tile_xor_rows<COLS>() ? (lane_off ^ (j << 5)) : lane_off + j * 32);
}
// Bytes from chunk pair kk % 4 of the first 128 bytes to pair kk.
__device__ __forceinline__ constexpr unsigned tile_chunk_step(int kk) { return (kk / 4) * 128; }

// Copies rows [row0, row0 + ROWS) of a [rows, COLS] matrix (rows GS elements
// apart in global memory, or where `map` puts them) into a shared-memory tile
// (`tile_offset`) with NTH threads; rows past `limit` are zero-filled.
template <int ROWS, int COLS, int NTH = NT, int GS = COLS, typename Map = Rows>
__device__ __forceinline__ void load_tile(elem_t* s, const elem_t* g, int row0, int limit, int tid, Map map = Map()) {
    constexpr int CH = COLS / 8;
    // (A paged map shuffles: every lane must run every pass.)
    static_assert(Map::CONTIGUOUS || ((tile_xor_rows<COLS>() ? ROWS % (NTH / 8) == 0 : ROWS * CH % NTH == 0) &&
                                      ROWS <= (WARP - 1) * 16), "paged tile not covered evenly");
    const auto rows = map.template tile<ROWS>(row0, limit);
    // Rows past the end read an in-bounds row (contiguous: the first; paged:
    // row0) and write zeros.
    const int spare = Map::CONTIGUOUS ? 0 : row0;
    // Without a division per chunk: where a row has no more chunks than
    // there are threads, each thread keeps its chunk column and steps rows
    // (floor(NTH / CH) rows a pass; 12-chunk rows of d96 leave 8 of 128
    // threads idle); otherwise (72 chunks of Dqk 576 in one warp) the
    // threads walk each row's chunks, the last pass partly idle. Every lane
    // computes a row address in every pass (a paged row map shuffles).
    // (Dividing by 72 per chunk kept the loop from unrolling.)
#define LOAD_TILE_CHUNKS(ROW)                                                                 \
    if constexpr (tile_xor_rows<COLS>()) {                                                    \
        /* XOR rows: a thread takes one chunk column c8 of every 128 bytes of    */           \
        /* its row, and a pass NTH / 8 rows, so its rows share r % 8 (with 32    */           \
        /* threads, two values) and one destination offset serves all its        */           \
        /* copies: a row's XOR differs with r % 8, and a loader stepping rows by */           \
        /* fewer than 8 kept one offset register per row (MLA spilled).          */           \
        constexpr int RPP = NTH / 8, PASSES = (ROWS + RPP - 1) / RPP, G = COLS / 64;         \
        const int rs = tid / 8, c8 = tid % 8;                                                 \
        _Pragma("unroll") for (int p = 0; p < PASSES; ++p) {                                  \
            const int r = rs + p * RPP;                                                       \
            const bool mine = ROWS % RPP == 0 || r < ROWS;                                    \
            const int gr = row0 + (ROWS % RPP == 0 ? r : min(r, ROWS - 1));                   \
            const bool ok = gr < limit;                                                       \
            const elem_t* src = g + (ROW(ok ? gr : spare)) * GS + c8 * 8;                     \
            const unsigned dst = smem_at(s, tile_offset<COLS>(r, c8 * 8));                   \
            _Pragma("unroll") for (int gi = 0; gi < G; ++gi)                                  \
                if (mine) cp_async16(dst + gi * 64 * (unsigned)sizeof(elem_t), src + gi * 64, ok ? 16 : 0); \
        }                                                                                     \
    } else if constexpr (CH <= NTH) { /* padded rows */                                     \
        constexpr int RPP = NTH / CH, PASSES = (ROWS + RPP - 1) / RPP;                        \
        const int r0 = tid / CH, cc = tid % CH;                                               \
        const bool active = NTH % CH == 0 || tid < RPP * CH;                                  \
        _Pragma("unroll") for (int p = 0; p < PASSES; ++p) {                                  \
            const int r = r0 + p * RPP;                                                       \
            const bool mine = active && (ROWS % RPP == 0 || r < ROWS);                        \
            const int gr = row0 + (ROWS % RPP == 0 && NTH % CH == 0 ? r : min(r, ROWS - 1));  \
            const bool ok = gr < limit;                                                       \
            const elem_t* src = g + (ROW(ok ? gr : spare)) * GS + cc * 8;                     \
            if (mine) cp_async16(smem_at(s, r * (COLS + PAD) + cc * 8), src, ok ? 16 : 0);   \
        }                                                                                     \
    } else {                                                                                  \
        constexpr int CPASSES = (CH + NTH - 1) / NTH;                                         \
        _Pragma("unroll") for (int r = 0; r < ROWS; ++r) {                                    \
            const int gr = row0 + r;                                                          \
            const bool ok = gr < limit;                                                       \
            const elem_t* src = g + (ROW(ok ? gr : spare)) * GS;                              \
            _Pragma("unroll") for (int p = 0; p < CPASSES; ++p) {                             \
                const int cc = tid + p * NTH;                                                 \
                if (CH % NTH == 0 || cc < CH)                                                 \
                    cp_async16(smem_at(s, r * (COLS + PAD) + cc * 8), src + cc * 8, ok ? 16 : 0);  \
            }                                                                                 \
        }                                                                                     \
    }
#define ONE_PAGE_ROW(x) (rows.base + (x))
    if (rows.one_page) {
        LOAD_TILE_CHUNKS(ONE_PAGE_ROW)
    } else {
        LOAD_TILE_CHUNKS(rows)
    }
#undef ONE_PAGE_ROW
#undef LOAD_TILE_CHUNKS
}
