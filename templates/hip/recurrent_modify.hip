{# The variant's modifications of a tile in LDS (after the regions; needs
   modify_q, modify_k, modify_v). #}// Rewrites a C × COLS tile in place (element (r, c) at s[r · RS + c · CS]) over
// NTH work-items: the variant's modification of each element (closures that
// read inputs by step get the step clamped into the sequence) and, for K̃ and
// Ṽ, zeros for steps past the end, so they add nothing.
template <int COLS, int RS, int CS, int KIND, int NTH>
__device__ __forceinline__ void modify_tile(elem_t* s, int t0, int col0, int h, const Params& P, int tid) {
    for (int x = tid; x < C * COLS; x += NTH) {
        // Consecutive work-items on consecutive addresses.
        const int r = CS == 1 ? x / COLS : x % C, c = CS == 1 ? x % COLS : x / C;
        const int t = t0 + r;
        elem_t* p = s + r * RS + c * CS;
        float val = to_f32(*p);
        const Pt pt = step_point(h, t, col0 + c, P);
{% if modify_q %}        if (KIND == 0) val = modify_q(val, pt, P);
{% endif %}{% if modify_k %}        if (KIND == 1) val = modify_k(val, pt, P);
{% endif %}{% if modify_v %}        if (KIND == 2) val = modify_v(val, pt, P);
{% endif %}        if (KIND != 0 && t >= P.seq_len) val = 0.0f;
        *p = from_f32(val);
        (void)pt;
    }
}
{% if !per_key %}
// The cumulative log2 decay of steps t0 … t0 + C − 1 into sL[0 … C − 1] by
// one wave (a lane per step; 0 past the end of the sequence).
__device__ __forceinline__ void decay_scan(float* sL, int t0, int h, const Params& P, int lane) {
{% if decay %}    const float x = lane < C && t0 + lane < P.seq_len ? log2_decay(decay_fn(step_point(h, t0 + lane, 0, P), P)) : 0.0f;
{% else %}    const float x = 0.0f;
{% endif %}    const float sum = wave_scan<false>(x, lane, C);
    if (lane < C) sL[lane] = sum;
}
{% endif %}