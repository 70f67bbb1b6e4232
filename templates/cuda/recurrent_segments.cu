{# The sequence-segment schedule of the sm_90a recurrent forward (included by
   recurrent_fwd_sm90.cu after recurrent_state.cu; the plan is SegmentSplit in
   compiler/src/cuda/recurrent_wgmma.rs). #}// ---- sequence segments ------------------------------------------------------
// The chains of the launch — one per (Dv slice, head, sequence), slice
// fastest — are `n_whole` chains walked whole, then `n_tail` chains cut into
// `n_seg` segments each. Segment p > 0 runs the state recurrence alone over
// segment p − 1, adds the state entering segment p − 1 (the initial state for
// p = 1, else the one that segment's block published in `carry`), publishes
// the sum for segment p + 1 and walks its own steps from it.
struct Work {
    int chain;  // the chain, in launch order
    int seg, n_seg;  // the segment and the chain's number of segments (1: whole)
    int tail;  // the chain's index among the cut ones (-1: whole)
};

// The block's work item, kept in shared memory. With a schedule, blocks
// take items in the order they start from the counter sched[0], so every
// segment a block waits for was taken by a block that is already running;
// without one (`sched` null) the grid is (slices, H, sequences) and every
// chain is whole, as it is in a kernel compiled without SEGMENTS.
__device__ __forceinline__ void take_work(int* sched, int* s_item) {
    if (threadIdx.x == 0)
        *s_item = sched ? atomicAdd(sched, 1) : blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    __syncthreads();
}

// Item `item`'s chain and segment. Cheap to recompute from the item (read
// again from shared memory, volatile) where needed, which keeps it out of
// registers held across the chunk loops.
__device__ __forceinline__ Work work_of(const int* s_item, const int* sched, int n_whole, int n_tail, int n_seg) {
    const int item = *reinterpret_cast<const volatile int*>(s_item);
    Work w;
    if (!SEGMENTS || !sched || item < n_whole) {
        w.chain = item;
        w.seg = 0;
        w.n_seg = 1;
        w.tail = -1;
    } else {
        const int u = item - n_whole;
        w.tail = u % n_tail;
        w.seg = u / n_tail;
        w.n_seg = n_seg;
        w.chain = n_whole + w.tail;
    }
    return w;
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

// dst ← dst + f · prev over a DK × DVT f32 slice (dst's rows DVT apart,
// prev's `prev_ld`), by the 128 threads of a warpgroup, 16 bytes at a time
// and past L1: `prev` may have been written by another block during this
// launch. Through memory rather than the state's registers, which are all
// taken while the state is held.
__device__ __forceinline__ void state_combine(float* dst, const float* prev, int prev_ld, float f, int wtid) {
    for (int x = wtid; x < DK * DVT / 4; x += WG) {
        const int r = x / (DVT / 4), c = (x % (DVT / 4)) * 4;
        float4* d = reinterpret_cast<float4*>(dst + r * DVT + c);
        float4 a = __ldcg(d);
        const float4 b = __ldcg(reinterpret_cast<const float4*>(prev + (long long)r * prev_ld + c));
        a.x += f * b.x;
        a.y += f * b.y;
        a.z += f * b.z;
        a.w += f * b.w;
        __stcg(d, a);
    }
}
// ---------------------------------------------------------------------------
