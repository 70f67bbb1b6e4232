{# A decay per key dimension in the chunked kernels (included after the
   variant's regions; needs C, DK, NB, PAIRS, SKS, NT and decay_fn). #}// Scales an m16k16 A fragment per column: f points at the table entry of the
// lane's first column (registers 0, 1 hold columns c, c + 1; 2, 3 hold c + 8, c + 9).
__device__ __forceinline__ unsigned scale2(unsigned x, float f0, float f1) {
    const elem_t* e = reinterpret_cast<const elem_t*>(&x);
    return pack2(to_f32(e[0]) * f0, to_f32(e[1]) * f1);
}

__device__ __forceinline__ void scale_frag(const unsigned (&a)[4], const float* f, unsigned (&out)[4]) {
    const float2 lo = *reinterpret_cast<const float2*>(f);
    const float2 hi = *reinterpret_cast<const float2*>(f + 8);
    out[0] = scale2(a[0], lo.x, lo.y);
    out[1] = scale2(a[1], lo.x, lo.y);
    out[2] = scale2(a[2], hi.x, hi.y);
    out[3] = scale2(a[3], hi.x, hi.y);
}

// Column c (key dimension col0 + c) of block blk of the chunk from t0: the
// in-block prefix sums of its log2 decays (0 past the end of the sequence);
// returns the block's total.
__device__ __forceinline__ float block_log_prefix(float (&pre)[16], int col0, int c, int blk, int t0, int h, const Params& P) {
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        const int t = t0 + blk * 16 + i;
        sum += t < P.seq_len ? log2_decay(decay_fn(step_point(h, t, col0 + c, P), P)) : 0.f;
        pre[i] = sum;
    }
    return sum;
}

// The chunk's cumulative log2 decay per key column, sLk[t * COLS + c] = L_t
// of key dimension col0 + c (sT: NB × COLS scratch); ends with a barrier.
template <int COLS>
__device__ __forceinline__ void decay_log_cumulative(float* sLk, float* sT, int col0, int t0, int h, const Params& P, int tid) {
    for (int x = tid; x < COLS * NB; x += NT) {
        const int c = x % COLS, blk = x / COLS;
        float pre[16];
        sT[blk * COLS + c] = block_log_prefix(pre, col0, c, blk, t0, h, P);
#pragma unroll
        for (int i = 0; i < 16; ++i) sLk[(blk * 16 + i) * COLS + c] = pre[i];
    }
    __syncthreads();
    for (int x = tid; x < C * COLS; x += NT) {
        const int c = x % COLS, blk = x / COLS / 16;
        float before = 0.f;
        for (int j = 0; j < blk; ++j) before += sT[j * COLS + c];
        sLk[x] += before;
    }
    __syncthreads();
}

// The chunk's decay per key dimension folded into its operands (the modified
// tiles Q̃ (when given) and K̃ must be complete; ends with a barrier):
// Q̃ → q̃ 2^(L_t − R_i) and K̃ → k̃ 2^(R_{i+1} − L_t) within each 16-step block i,
// then the factor tables of the scores (sFa), of the state's share (sFq, with
// the chunk's whole decay in row NB) and of the state update (sFk).
__device__ __forceinline__ void decay_operands(elem_t* cQ, elem_t* cK, float* sT, float* sFa, float* sFq, float* sFk, int t0, int h, const Params& P, int tid) {
    // One thread per (key column, block): its 16 steps' prefix sums.
    for (int x = tid; x < DK * NB; x += NT) {
        const int d = x % DK, blk = x / DK;
        float pre[16];
        const float sum = block_log_prefix(pre, 0, d, blk, t0, h, P);
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            const int r = blk * 16 + i;
            if (cQ) cQ[r * SKS + d] = from_f32(to_f32(cQ[r * SKS + d]) * fast_exp2(pre[i]));
            cK[r * SKS + d] = from_f32(to_f32(cK[r * SKS + d]) * fast_exp2(sum - pre[i]));
        }
        sT[blk * DK + d] = sum;
    }
    __syncthreads();
    // One thread per key column: the block boundaries R_j and the tables.
    for (int d = tid; d < DK; d += NT) {
        float R[NB + 1];
        R[0] = 0.f;
#pragma unroll
        for (int j = 0; j < NB; ++j) R[j + 1] = R[j] + sT[j * DK + d];
#pragma unroll
        for (int i = 0; i < NB; ++i)
#pragma unroll
            for (int j = 0; j <= i; ++j) sFa[(i * (i + 1) / 2 + j) * DK + d] = fast_exp2(R[i] - R[j + 1]);
#pragma unroll
        for (int j = 0; j <= NB; ++j) sFq[j * DK + d] = fast_exp2(R[j]);
#pragma unroll
        for (int j = 0; j < NB; ++j) sFk[j * DK + d] = fast_exp2(R[NB] - R[j + 1]);
    }
    __syncthreads();
}
