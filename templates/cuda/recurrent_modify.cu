{# The sm_80 recurrent templates' in-place tile modification (included after
   the variant's regions; needs NT, modify_q/k/v and their closures). #}// Rewrites a tile of ROWS steps from t0 in place (row stride STRIDE): the
// variant's modification of each element (closures that read inputs by step
// get the step clamped into the sequence) and zeros for steps past the end,
// so they add nothing.
template <int ROWS, int COLS, int STRIDE, int KIND>
__device__ __forceinline__ void modify_tile(elem_t* s, int t0, int col0, int h, const Params& P, int tid) {
#pragma unroll 4
    for (int x = tid; x < ROWS * COLS / 2; x += NT) {
        const int r = x / (COLS / 2), c = (x % (COLS / 2)) * 2;
        const int t = t0 + r;
        elem_t* p = s + r * STRIDE + c;
        float v0 = to_f32(p[0]), v1 = to_f32(p[1]);
        const Pt pt0 = step_point(h, t, col0 + c, P);
        const Pt pt1 = step_point(h, t, col0 + c + 1, P);
{% if modify_q %}        if (KIND == 0) { v0 = modify_q(v0, pt0, P); v1 = modify_q(v1, pt1, P); }
{% endif %}{% if modify_k %}        if (KIND == 1) { v0 = modify_k(v0, pt0, P); v1 = modify_k(v1, pt1, P); }
{% endif %}{% if modify_v %}        if (KIND == 2) { v0 = modify_v(v0, pt0, P); v1 = modify_v(v1, pt1, P); }
{% endif %}        if (t >= P.seq_len) { v0 = 0.f; v1 = 0.f; }
        p[0] = from_f32(v0);
        p[1] = from_f32(v1);
    }
}

