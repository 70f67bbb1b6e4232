{# The chunk's decay as log2 prefix sums (included by the recurrent templates
   after the variant's regions; needs `decay` and, with it, decay_fn). #}// log2 of a step's decay, floored at −160: a decay that underflows f32 is 0,
// whose log2 −inf would make a chunk's prefix sums give −inf − −inf = NaN;
// 2^−160 is 0 in f32 all the same. (A NaN, from a negative decay, stays NaN.)
__device__ __forceinline__ float log2_decay(float g) {
    const float l = log2f(g);
    return l < -160.0f ? -160.0f : l;
}

// The gradient of a step's decay from that of its log (d ln g = dg / g). Where
// the decay is below f32's smallest normal number (0, its log floored, or a
// denormal) the exact d ln g = g · dL/dg is below 1e-38 and none is passed on:
// dlog / g there overflowed to inf (or was 0 / 0).
__device__ __forceinline__ float decay_grad_from_log(float dlog, float g) {
    return g >= 1.17549435e-38f ? dlog / g : 0.0f;
}

// The log2 decays of the chunk's steps from t0 (lane l: steps l, l + WARP, …),
// 0 past the end of the sequence.
__device__ __forceinline__ void chunk_log_decays(float (&x)[C / WARP], int t0, int h, const Params& P, int lane) {
#pragma unroll
    for (int part = 0; part < C / WARP; ++part) {
        const int t = t0 + part * WARP + lane;
{% if decay %}        x[part] = t < P.seq_len ? log2_decay(decay_fn(step_point(h, t, 0, P), P)) : 0.f;
{% else %}        x[part] = 0.f;
        (void)t; (void)h; (void)P;
{% endif %}    }
}

{% if decay %}// The decay's custom inputs for the chunk from t0 (lane l: steps l,
// l + WARP, …), read ahead of their arithmetic (`chunk_log_decays_from`): a
// read consumed where it is issued stalls the warp for the memory's latency,
// and in a chain of chunks that latency is paid every chunk.
__device__ __forceinline__ void chunk_decay_reads(float (&raw)[C / WARP][DECAY_FN_READS], int t0, int h, const Params& P,
                                                  int lane) {
#pragma unroll
    for (int part = 0; part < C / WARP; ++part) {
        const int t = t0 + part * WARP + lane;
        if (t < P.seq_len) decay_fn_reads(step_point(h, t, 0, P), P, raw[part]);
    }
}

// chunk_log_decays from what chunk_decay_reads read for the same t0.
__device__ __forceinline__ void chunk_log_decays_from(float (&x)[C / WARP], const float (&raw)[C / WARP][DECAY_FN_READS],
                                                      int t0, int h, const Params& P, int lane) {
#pragma unroll
    for (int part = 0; part < C / WARP; ++part) {
        const int t = t0 + part * WARP + lane;
        x[part] = t < P.seq_len ? log2_decay(decay_fn_from(raw[part], step_point(h, t, 0, P), P)) : 0.f;
    }
}

// decay_scan for a chain that reads the decay's inputs a chunk ahead: the
// chunk from t0 from `raw`, then (`more`) `raw` refilled with the inputs of
// the chunk from `next_t0` while the scan runs (one warp).
__device__ __forceinline__ void decay_scan_ahead(float* sL, float (&raw)[C / WARP][DECAY_FN_READS], int t0, bool more,
                                                 int next_t0, int h, const Params& P, int lane) {
    float x[C / WARP];
    chunk_log_decays_from(x, raw, t0, h, P, lane);
    if (more) chunk_decay_reads(raw, next_t0, h, P, lane);
    chunk_prefix_sum(x, sL, lane);
}

{% endif %}// Inclusive scan of log2(decay) over the chunk starting at t0 into sL (one warp).
__device__ __forceinline__ void decay_scan(float* sL, int t0, int h, const Params& P, int lane) {
    float x[C / WARP];
    chunk_log_decays(x, t0, h, P, lane);
    chunk_prefix_sum(x, sL, lane);
}
