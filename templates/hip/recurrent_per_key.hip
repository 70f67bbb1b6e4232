{# A decay per key dimension in the HIP chunked kernels (included after the
   variant's regions; needs C, DK, TT, SQS and decay_fn). #}// Key dimension d of 16-step block blk from t0: the in-block prefix sums of
// its log2 decays (0 past the end of the sequence); returns the block's total.
__device__ __forceinline__ float block_log_prefix(float (&pre)[16], int d, int blk, int t0, int h, const Params& P) {
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        const int t = t0 + blk * 16 + i;
        sum += t < P.seq_len ? log2_decay(decay_fn(step_point(h, t, d, P), P)) : 0.0f;
        pre[i] = sum;
    }
    return sum;
}

// The chunk's decay per key dimension folded into Q̃ and K̃ (C × DK tiles,
// rows SQS apart) in place over NTH work-items, then the factor tables of the
// scores (sFa, one row per tile pair), of the state's share (sFq, the chunk's
// whole decay in row TT; skipped when null) and of the state update (sFk);
// ends with a barrier. With R_j the cumulative log2 decay before 16-step block
// j: Q' = q̃ 2^(L_t − R_i), K' = k̃ 2^(R_{j+1} − L_s), both ≤ 1 in magnitude.
template <int NTH>
__device__ __forceinline__ void decay_operands(elem_t* sQ, elem_t* sK, float* sT, float* sFa, float* sFq, float* sFk, int t0, int h, const Params& P, int tid) {
    for (int x = tid; x < DK * TT; x += NTH) {
        const int d = x % DK, blk = x / DK;
        float pre[16];
        const float sum = block_log_prefix(pre, d, blk, t0, h, P);
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            const int r = blk * 16 + i;
            sQ[r * SQS + d] = from_f32(to_f32(sQ[r * SQS + d]) * fast_exp2(pre[i]));
            sK[r * SQS + d] = from_f32(to_f32(sK[r * SQS + d]) * fast_exp2(sum - pre[i]));
        }
        sT[blk * DK + d] = sum;
    }
    block_sync();
    for (int d = tid; d < DK; d += NTH) {
        float R[TT + 1];
        R[0] = 0.0f;
#pragma unroll
        for (int j = 0; j < TT; ++j) R[j + 1] = R[j] + sT[j * DK + d];
#pragma unroll
        for (int i = 0; i < TT; ++i)
#pragma unroll
            for (int j = 0; j <= i; ++j) sFa[(i * (i + 1) / 2 + j) * DK + d] = fast_exp2(R[i] - R[j + 1]);
        if (sFq)
#pragma unroll
            for (int j = 0; j <= TT; ++j) sFq[j * DK + d] = fast_exp2(R[j]);
#pragma unroll
        for (int j = 0; j < TT; ++j) sFk[j * DK + d] = fast_exp2(R[TT] - R[j + 1]);
    }
    block_sync();
}

// The chunk's cumulative log2 decay per key over NTH work-items: sLk[t · COLS
// + c] = L_t of key dimension d0 + c (sT: TT × COLS scratch); ends with a
// barrier.
template <int COLS, int NTH>
__device__ __forceinline__ void decay_log_cumulative(float* sLk, float* sT, int d0, int t0, int h, const Params& P, int tid) {
    for (int x = tid; x < COLS * TT; x += NTH) {
        const int c = x % COLS, blk = x / COLS;
        float pre[16];
        sT[blk * COLS + c] = block_log_prefix(pre, d0 + c, blk, t0, h, P);
#pragma unroll
        for (int i = 0; i < 16; ++i) sLk[(blk * 16 + i) * COLS + c] = pre[i];
    }
    block_sync();
    for (int x = tid; x < C * COLS; x += NTH) {
        const int c = x % COLS, blk = x / COLS / 16;
        float before = 0.0f;
        for (int j = 0; j < blk; ++j) before += sT[j * COLS + c];
        sLk[x] += before;
    }
    block_sync();
}
