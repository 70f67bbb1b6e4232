// A block's DK × DVT slice of a recurrent state (or of its gradient), held by
// each thread as SMT × SNT m16n8 accumulator tiles from row sm0 and column sn0,
// the m-tiles STATE_MT_ROWS rows apart (16: a warp's adjacent mma.sync tiles;
// 64: a warpgroup's wgmma tiles), staged in shared memory at STATE_AT
// (included by the recurrent templates; needs DK, DV, DVT, SVS, SMT, SNT, NT).
#ifndef STATE_MT_ROWS
#define STATE_MT_ROWS 16
#endif
#ifndef STATE_AT
#define STATE_AT(s, r, c) ((s) + (r) * SVS + (c))
#endif
typedef float state_frag[SMT][SNT][4];

// The thread's elements from an f32 [DK, LD] matrix at column e0 (zero where
// `src` is null).
template <int LD = DV>
__device__ __forceinline__ void state_load(state_frag& st, const float* src, int e0, int sm0, int sn0, int g, int t4) {
#pragma unroll
    for (int mt = 0; mt < SMT; ++mt)
#pragma unroll
    for (int nt = 0; nt < SNT; ++nt)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
        const int r = sm0 + mt * STATE_MT_ROWS + g + 8 * (c / 2), col = sn0 + nt * 8 + 2 * t4 + c % 2;
        st[mt][nt][c] = src ? src[(long long)r * LD + e0 + col] : 0.f;
    }
}

// The thread's elements into an f32 [DK, LD] matrix at column e0.
template <int LD = DV>
__device__ __forceinline__ void state_store(const state_frag& st, float* dst, int e0, int sm0, int sn0, int g, int t4) {
#pragma unroll
    for (int mt = 0; mt < SMT; ++mt)
#pragma unroll
    for (int nt = 0; nt < SNT; ++nt)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
        const int r = sm0 + mt * STATE_MT_ROWS + g + 8 * (c / 2), col = sn0 + nt * 8 + 2 * t4 + c % 2;
        dst[(long long)r * LD + e0 + col] = st[mt][nt][c];
    }
}

__device__ __forceinline__ void state_scale(state_frag& st, float f) {
#pragma unroll
    for (int mt = 0; mt < SMT; ++mt)
#pragma unroll
    for (int nt = 0; nt < SNT; ++nt)
#pragma unroll
    for (int c = 0; c < 4; ++c) st[mt][nt][c] *= f;
}

// Row r of the slice times f[r] (a decay per key dimension).
__device__ __forceinline__ void state_scale_rows(state_frag& st, const float* f, int sm0, int g) {
#pragma unroll
    for (int mt = 0; mt < SMT; ++mt)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
        const float x = f[sm0 + mt * STATE_MT_ROWS + g + 8 * (c / 2)];
#pragma unroll
        for (int nt = 0; nt < SNT; ++nt) st[mt][nt][c] *= x;
    }
}

// The thread's elements, in the element type, into a DK × DVT shared tile.
__device__ __forceinline__ void state_stage(const state_frag& st, elem_t* s, int sm0, int sn0, int g, int t4) {
#pragma unroll
    for (int mt = 0; mt < SMT; ++mt)
#pragma unroll
    for (int nt = 0; nt < SNT; ++nt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
        const int r = sm0 + mt * STATE_MT_ROWS + g + 8 * hf, col = sn0 + nt * 8 + 2 * t4;
        *reinterpret_cast<unsigned*>(STATE_AT(s, r, col)) = pack2(st[mt][nt][2 * hf], st[mt][nt][2 * hf + 1]);
    }
}

// A staged DK × DVT tile to a [DK, DV] matrix in global memory, 16-byte rows
// (stores straight from the fragments would write 16 bytes per row and warp).
__device__ __forceinline__ void state_copy_out(const elem_t* s, elem_t* dst, int tid) {
    constexpr int VEC = 8;  // elements per 16 bytes
    for (int x = tid; x < DK * DVT / VEC; x += NT) {
        const int r = x / (DVT / VEC), c = (x % (DVT / VEC)) * VEC;
        *reinterpret_cast<uint4*>(dst + (long long)r * DV + c) = *reinterpret_cast<const uint4*>(STATE_AT(s, r, c));
    }
}

// Inclusive prefix sums of a chunk's per-step log2 decays into sL, one warp:
// lane l holds steps l, l + WARP, … in x.
__device__ __forceinline__ void chunk_prefix_sum(const float (&x)[C / WARP], float* sL, int lane) {
    float carry = 0.f;
#pragma unroll
    for (int part = 0; part < C / WARP; ++part) {
        float y = x[part];
#pragma unroll
        for (int off = 1; off < WARP; off *= 2) {
            const float z = __shfl_up_sync(0xffffffffu, y, off);
            if (lane >= off) y += z;
        }
        sL[part * WARP + lane] = y + carry;
        carry += __shfl_sync(0xffffffffu, y, WARP - 1);
    }
}
