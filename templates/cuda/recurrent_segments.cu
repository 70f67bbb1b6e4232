{# The sequence-segment schedule of the sm_90a recurrent forward (included by
   recurrent_fwd_sm90.cu after recurrent_state.cu; the plan is SegmentSplit in
   compiler/src/cuda/recurrent_wgmma.rs). #}// ---- sequence segments ------------------------------------------------------
// The chains of the launch — one per (Dv slice, head, sequence), slice
// fastest — are `n_whole` chains walked whole, then `n_tail` chains cut into
// `n_seg` segments each. Work items, in the order blocks take them:
//   1. per cut chain, segments 0 … n_seg − 2 for the state alone (K̃ and Ṽ
//      only, from a zero state): the segment's own state and its total log2
//      decay go to `carry`, then a flag in `sched` is raised;
//   2. the whole chains;
//   3. per cut chain, every segment: its entering state is the initial
//      state with the published segments before it folded on, in order
//      (S ← 2^(l_j) S + S_j), then the full forward over its steps.
struct Work {
    int chain;  // the chain, in launch order
    int seg, n_seg;  // the segment and the chain's number of segments (1: whole)
    int tail;  // the chain's index among the cut ones (-1: whole)
    bool state_only;  // an item of kind 1
};

// The block's work item, kept in shared memory. With a schedule, blocks
// take items in the order they start from the counter sched[0], so every
// segment a block waits for was taken by a block that is already running;
// without one (`sched` null) the grid is (slices, H, sequences) and every
// chain is whole.
__device__ __forceinline__ void take_work(int* sched, int* s_item) {
    if (threadIdx.x == 0)
        *s_item = sched ? atomicAdd(sched, 1) : blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    __syncthreads();
}

// Item `item`'s chain and segment. Cheap to recompute from the item (read
// again from shared memory, volatile) where needed, which keeps it out of
// registers held across the chunk loops.
__device__ __forceinline__ Work work_of(const int* s_item, const int* sched, int n_whole, int n_tail, int n_seg) {
    int item = *reinterpret_cast<const volatile int*>(s_item);
    Work w;
    w.chain = item;
    w.seg = 0;
    w.n_seg = 1;
    w.tail = -1;
    w.state_only = false;
    if (!sched) return w;
    const int n_pre = n_tail * (n_seg - 1);
    if (item >= n_pre && item < n_pre + n_whole) {
        w.chain = item - n_pre;
        return w;
    }
    w.state_only = item < n_pre;
    if (!w.state_only) item -= n_pre + n_whole;
    w.tail = item % n_tail;
    w.seg = item / n_tail;
    w.n_seg = n_seg;
    w.chain = n_whole + w.tail;
    return w;
}

// Where segment j of cut chain `tail` publishes: its state (DK × DVT f32,
// rows DVT apart), its total log2 decay and its flag.
__device__ __forceinline__ int published(int tail, int j, int n_seg) {
    return tail * (n_seg - 1) + j;
}
__device__ __forceinline__ float* published_log_decays(float* carry, int n_tail, int n_seg) {
    return carry + (long long)n_tail * (n_seg - 1) * DK * DVT;
}

// The first chunk of segment p of n_seg over n_chunks chunks.
__device__ __forceinline__ int segment_chunk(int n_chunks, int p, int n_seg) {
    return (int)((long long)n_chunks * p / n_seg);
}

__device__ __forceinline__ void flag_release(int* flag) {
    asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(flag), "r"(1) : "memory");
}

__device__ __forceinline__ void flag_acquire(const int* flag) {
    int v = 0;
    do {
        asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(flag) : "memory");
    } while (v == 0);
}

// Where segment p ≥ 1 of cut chain `tail` forms its entering state
// (DK × DVT f32, rows DVT apart), after the published ones.
__device__ __forceinline__ float* entering_slot(float* carry, int n_tail, int n_seg, int tail, int p) {
    const long long n_published = (long long)n_tail * (n_seg - 1);
    return carry + n_published * (DK * DVT + 1) + (long long)published(tail, p - 1, n_seg) * DK * DVT;
}

// Segment w.seg's entering state into its slot, by all NT threads before
// the warpgroups part (the state's registers are not taken yet): the
// initial state (`init`: its DK × DVT slice, rows DV apart; null: zero) with
// the published segments before this one folded on in order,
// S ← 2^(l_j) S + S_j, each read past L1 once its flag is up.
__device__ __forceinline__ void fold_entering_state(float* carry, const int* sched, int n_tail, int n_seg, const Work& w,
                                                    const float* init, int tid) {
    const int j0 = published(w.tail, 0, n_seg);
    if (tid == 0)
        for (int j = j0; j < j0 + w.seg; ++j) flag_acquire(sched + 1 + j);
    __syncthreads();
    const float* l = published_log_decays(carry, n_tail, n_seg);
    float* slot = entering_slot(carry, n_tail, n_seg, w.tail, w.seg);
#pragma unroll 4
    for (int x = tid; x < DK * DVT / 4; x += NT) {
        const int r = x / (DVT / 4), c = (x % (DVT / 4)) * 4;
        float4 a = init ? *reinterpret_cast<const float4*>(init + (long long)r * DV + c) : make_float4(0.f, 0.f, 0.f, 0.f);
        for (int j = j0; j < j0 + w.seg; ++j) {
            const float f = fast_exp2(__ldcg(l + j));
            const float4 b = __ldcg(reinterpret_cast<const float4*>(carry + (long long)j * DK * DVT + r * DVT + c));
            a.x = f * a.x + b.x;
            a.y = f * a.y + b.y;
            a.z = f * a.z + b.z;
            a.w = f * a.w + b.w;
        }
        *reinterpret_cast<float4*>(slot + r * DVT + c) = a;
    }
    __syncthreads();
}
// ---------------------------------------------------------------------------
