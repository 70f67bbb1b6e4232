{# What the HIP recurrent templates share before the variant's regions: the
   parameters, the point, the sequence of a workgroup and the helpers that
   read tiles and build operands (needs params_fields). #}// log2 of a step's decay, floored at −160: a decay that underflows f32 is 0,
// whose log2 −inf would make a chunk's prefix sums give −inf − −inf = NaN;
// 2^−160 is 0 in f32 all the same. (A NaN, from a negative decay, stays NaN.)
__device__ __forceinline__ float log2_decay(float g) {
    const float l = __log2f(g);
    return l < -160.0f ? -160.0f : l;
}

// The gradient of a step's decay from that of its log (d ln g = dg / g). Where
// the decay is below f32's smallest normal number (0, its log floored, or a
// denormal) the exact d ln g = g · dL/dg is below 1e-38 and none is passed on:
// dlog / g there overflowed to inf (or was 0 / 0).
__device__ __forceinline__ float decay_grad_from_log(float dlog, float g) {
    return g >= 1.17549435e-38f ? dlog / g : 0.0f;
}

// The custom inputs (and, in the backward, their gradients) and the sizes; the
// workgroup's sequence: its batch index in the inputs, first step and length
// (a packed variable-length batch has every sequence in batch 0, one after
// another along S).
struct Params {
{{ params_fields }}    int B, H, S;
    int seq_b, seq_t0, seq_len;
};

// A point of the iteration space: batch, head, step, head-dim coordinate.
struct Pt {
    int b, h, t, d;
};

// Sequence b: with `cu_seqlens` steps cu_seqlens[b] … cu_seqlens[b + 1] − 1 of
// batch 0, else batch b, all S steps.
__device__ __forceinline__ void sequence_of(Params& P, int b, const int* cu_seqlens) {
    P.seq_b = cu_seqlens ? 0 : b;
    P.seq_t0 = cu_seqlens ? cu_seqlens[b] : 0;
    P.seq_len = cu_seqlens ? cu_seqlens[b + 1] - P.seq_t0 : P.S;
}

// Where the chunks of sequence b, head h (n_chunks of them) start in the
// backward's per-chunk workspaces: sequence after sequence, each its heads'
// chunks. A packed batch's chunk offsets follow its N + 1 boundaries in
// `cu_seqlens` (N sequences: the grid's z).
__device__ __forceinline__ long long chunk_base(const Params& P, int b, int h, int n_chunks, const int* cu_seqlens) {
    return cu_seqlens ? (long long)cu_seqlens[NBLK_Z + 1 + b] * P.H + (long long)h * n_chunks
                      : ((long long)b * P.H + h) * n_chunks;
}

// Step t of the sequence as a point of the inputs (closures read custom
// inputs there); steps past the end are clamped to the last one.
__device__ __forceinline__ Pt step_point(int h, int t, int d, const Params& P) {
    return Pt{P.seq_b, h, P.seq_t0 + min(t, P.seq_len - 1), d};
}

// Rows [row0, row0 + ROWS) of a [rows, COLS] matrix (rows GS elements apart)
// into registers, 8 elements per chunk, over NTH work-items; rows at or past
// `limit` read as zeros.
template <int ROWS, int COLS, int CH, int GS, int NTH>
__device__ __forceinline__ void load_rows(u16x8 (&r)[CH], const elem_t* g, int row0, int limit, int tid) {
#pragma unroll
    for (int c = 0; c < CH; ++c) {
        const int x = tid + c * NTH;
        const int rr = x / (COLS / 8), cc = x % (COLS / 8);
        r[c] = (x < ROWS * COLS / 8 && row0 + rr < limit) ? load8(g + (long long)(row0 + rr) * GS + cc * 8) : zero8();
    }
}

// Rows [row0, row0 + ROWS) of a [rows, COLS] matrix into LDS over NTH
// work-items: as they stand (`dst[r · DS + c]`, TRANSPOSE false) or
// transposed (`dst[c · DS + r]`); rows at or past `limit` as zeros.
template <int ROWS, int COLS, int GS, int DS, bool TRANSPOSE, int NTH>
__device__ __forceinline__ void load_tile(elem_t* dst, const elem_t* g, int row0, int limit, int tid) {
    for (int x = tid; x < ROWS * COLS / 8; x += NTH) {
        const int r = x / (COLS / 8), c = (x % (COLS / 8)) * 8;
        const u16x8 v = row0 + r < limit ? load8(g + (long long)(row0 + r) * GS + c) : zero8();
        if (TRANSPOSE) {
#pragma unroll
            for (int e = 0; e < 8; ++e) dst[(c + e) * DS + r] = v[e];
        } else {
            store8(dst + r * DS + c, v);
        }
    }
}

// Four elements p[0], p[stride], p[2 stride], p[3 stride], each times f[e], as an MFMA operand.
__device__ __forceinline__ frag4 frag_scaled(const elem_t* p, int stride, const float (&f)[4]) {
    return frag_of(from_f32(to_f32(p[0]) * f[0]), from_f32(to_f32(p[stride]) * f[1]),
                   from_f32(to_f32(p[2 * stride]) * f[2]), from_f32(to_f32(p[3 * stride]) * f[3]));
}

// The lanes holding one column of an accumulator tile are l, l ^ 16, l ^ 32, l ^ 48.
__device__ __forceinline__ float column_lanes_sum(float x) {
    x += lane_xor_f(x, 16);
    x += lane_xor_f(x, 32);
    return x;
}

// The 16 lanes holding one row of an accumulator tile (l with the same l / 16).
__device__ __forceinline__ float row_lanes_sum(float x) {
    x += lane_xor_f(x, 1);
    x += lane_xor_f(x, 2);
    x += lane_xor_f(x, 4);
    x += lane_xor_f(x, 8);
    return x;
}

// An inclusive prefix sum over lanes 0 … n − 1 (n ≤ WAVE) of the wave,
// forwards (lane l gets Σ_{m ≤ l}) or backwards (Σ_{m ≥ l}).
template <bool BACKWARDS>
__device__ __forceinline__ float wave_scan(float x, int lane, int n) {
    for (int off = 1; off < n; off *= 2) {
        const int src = BACKWARDS ? lane + off : lane - off;
        const bool in = BACKWARDS ? src < n : src >= 0;
        const float y = lane_read_f(x, in ? src : lane);
        if (in) x += y;
    }
    return x;
}
