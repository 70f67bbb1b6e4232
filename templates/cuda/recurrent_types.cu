{# The recurrent templates' element type, kernel parameters and point
   (included first by each; needs sp and params_fields). #}typedef {{ sp.c_type }} elem_t;

// The custom inputs (and, in the backward, their gradients) and the sizes.
struct Params {
{{ params_fields }}    int B, H, S;
    // The block's sequence: its batch index in the inputs, first step and
    // length. A packed variable-length batch has every sequence in batch 0,
    // one after another along S; otherwise sequence b is batch b, all S steps.
    int seq_b, seq_t0, seq_len;
};

// A point of the iteration space: batch, head, step, head-dim coordinate.
struct Pt {
    int b, h, t, d;
};

// Sequence b: with `cu_seqlens` (a packed batch, S its total) steps
// cu_seqlens[b] … cu_seqlens[b + 1] − 1 of batch 0, else batch b.
__device__ __forceinline__ void sequence_of(Params& P, int b, const int* cu_seqlens) {
    P.seq_b = cu_seqlens ? 0 : b;
    P.seq_t0 = cu_seqlens ? cu_seqlens[b] : 0;
    P.seq_len = cu_seqlens ? cu_seqlens[b + 1] - P.seq_t0 : P.S;
}

// Where the chunks of sequence b, head h (n_chunks of them) start in the
// per-chunk workspaces of the backward: sequence after sequence, each its
// heads' chunks. A packed batch's chunk offsets follow its N + 1 boundaries
// in `cu_seqlens` (N = gridDim.z).
__device__ __forceinline__ long long chunk_base(const Params& P, int b, int h, int n_chunks, const int* cu_seqlens) {
    return cu_seqlens ? (long long)cu_seqlens[gridDim.z + 1 + b] * P.H + (long long)h * n_chunks
                      : ((long long)b * P.H + h) * n_chunks;
}

// Step t of the block's sequence as a point of the inputs (closures read
// custom inputs there); steps past the end are clamped to the last one.
__device__ __forceinline__ Pt step_point(int h, int t, int d, const Params& P) {
    return Pt{P.seq_b, h, P.seq_t0 + min(t, P.seq_len - 1), d};
}
