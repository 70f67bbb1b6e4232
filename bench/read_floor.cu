// Read-floor kernels for bench/read_floor.py: plain reads of two buffers
// (the K and V of a decoding call) at the rates the hardware allows, for the
// decoding kernels' bytes-per-second to be judged against.
typedef unsigned long long u64_t;
// Plain reads of two buffers (K and V of a decoding call), 16-byte loads.
extern "C" __global__ void __launch_bounds__(512) read_vec(const uint4* __restrict__ a, const uint4* __restrict__ b, long long n16, unsigned* out) {
    unsigned acc = 0;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (int s = 0; s < 2; ++s) {
        const uint4* p = s ? b : a;
        long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
        for (; i + 7 * stride < n16; i += 8 * stride) {
            uint4 x[8];
#pragma unroll
            for (int u = 0; u < 8; ++u) x[u] = __ldcs(p + i + u * stride);
#pragma unroll
            for (int u = 0; u < 8; ++u) acc ^= x[u].x ^ x[u].y ^ x[u].z ^ x[u].w;
        }
        for (; i < n16; i += stride) { uint4 x = __ldcs(p + i); acc ^= x.x ^ x.y ^ x.z ^ x.w; }
    }
    if (acc == 0x12345678u) out[0] = acc;
}
__device__ __forceinline__ unsigned su32(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

// One thread streams `nch` chunks into a ring of `stages` buffers of `chunk`
// bytes by bulk copies, each buffer waited for before it is refilled; chunk c
// is `len(c)` bytes from `src(c)`. Reads a word of each landed chunk so that
// nothing is dead.
template <class Src, class Len>
__device__ unsigned stream_ring(char* ring, u64_t* bar, int stages, int chunk, long long nch, Src src, Len len) {
    for (int s = 0; s < stages; ++s) asm volatile("mbarrier.init.shared.b64 [%0], 1;" ::"r"(su32(&bar[s])));
    asm volatile("fence.mbarrier_init.release.cluster;");
    unsigned acc = 0;
    for (long long c = 0; c < nch + stages; ++c) {
        if (c >= stages) {
            const int s = (c - stages) % stages;
            const unsigned ph = ((c - stages) / stages) & 1;
            asm volatile("{\n.reg .pred p;\nW: mbarrier.try_wait.parity.shared.b64 p, [%0], %1;\n@!p bra W;\n}" ::"r"(su32(&bar[s])), "r"(ph));
            acc ^= *(volatile unsigned*)(ring + s * chunk);
        }
        if (c < nch) {
            const int s = c % stages, n = len(c);
            asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" ::"r"(su32(&bar[s])), "r"(n));
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(su32(ring + s * chunk)),
                         "l"(src(c)), "r"(n), "r"(su32(&bar[s]))
                         : "memory");
        }
    }
    return acc;
}

// Contiguous slices of a‖b, one per block.
extern "C" __global__ void __launch_bounds__(128) read_bulk(const char* __restrict__ a, const char* __restrict__ b, long long na, long long nb, int chunk, int stages, unsigned* out) {
    // a's na bytes then b's nb (na a multiple of chunk: no chunk straddles them).
    extern __shared__ __align__(128) char ring[];
    __shared__ __align__(8) u64_t bar[16];
    if (threadIdx.x != 0) return;
    const long long total = na + nb;
    const long long per = ((total / gridDim.x) + chunk - 1) / chunk * chunk;
    const long long lo = (long long)blockIdx.x * per, hi = min(lo + per, total);
    const long long nch = hi > lo ? (hi - lo + chunk - 1) / chunk : 0;
    const unsigned acc = stream_ring(
        ring, bar, stages, chunk, nch,
        [&](long long c) {
            const long long off = lo + c * chunk;
            return off < na ? a + off : b + (off - na);
        },
        [&](long long c) { return (int)min((long long)chunk, hi - (lo + c * chunk)); });
    if (acc == 0x12345678u) out[0] = acc;
}

// As the decoding kernels read: block x streams the same byte range of both
// buffers (its keys' K rows and V rows), a chunk of each in turn.
extern "C" __global__ void __launch_bounds__(128) read_bulk2(const char* __restrict__ a, const char* __restrict__ b, long long nbytes, int chunk, int stages, unsigned* out) {
    extern __shared__ __align__(128) char ring[];
    __shared__ __align__(8) u64_t bar[16];
    if (threadIdx.x != 0) return;
    const long long per = ((nbytes / gridDim.x) + chunk - 1) / chunk * chunk;
    const long long lo = (long long)blockIdx.x * per, hi = min(lo + per, nbytes);
    const long long nch = hi > lo ? 2 * ((hi - lo + chunk - 1) / chunk) : 0;
    const unsigned acc = stream_ring(
        ring, bar, stages, chunk, nch,
        [&](long long c) { return ((c & 1) ? b : a) + lo + (c / 2) * chunk; },
        [&](long long c) { return (int)min((long long)chunk, hi - (lo + (c / 2) * chunk)); });
    if (acc == 0x12345678u) out[0] = acc;
}

// As the sm_80-template decoding kernel loads (`LOAD_TILE` by `cp.async`):
// block x copies its key range of K and of V in steps of `rows` rows of 256
// bytes each, every thread 16 bytes at a time, into a ring of `stages` steps;
// at each step it waits for the oldest, meets the block at a barrier and
// starts the step `stages - 1` ahead. (`stages` 3 or 4: `cp.async.wait_group`
// takes an immediate.)
extern "C" __global__ void __launch_bounds__(512) read_cp_async(const char* __restrict__ a, const char* __restrict__ b, long long nbytes, int rows, int stages, unsigned* out) {
    extern __shared__ __align__(128) char ring[];
    if (stages != 3 && stages != 4) __trap();
    const int step = rows * 256;  // bytes of K (and of V) per step
    const long long per = ((nbytes / gridDim.x) + step - 1) / step * step;
    const long long lo = (long long)blockIdx.x * per, hi = min(lo + per, nbytes);
    const int n = hi > lo ? (int)((hi - lo + step - 1) / step) : 0;
    auto issue = [&](int it) {
        char* dst = ring + (it % stages) * 2 * step;
        for (int x = threadIdx.x * 16; x < 2 * step; x += blockDim.x * 16) {
            const long long off = lo + (long long)it * step + (x % step);
            if (off < hi)
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(su32(dst + x)), "l"((x < step ? a : b) + off) : "memory");
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    };
    for (int s = 0; s < stages - 1; ++s)
        if (s < n) issue(s);
        else asm volatile("cp.async.commit_group;" ::: "memory");
    unsigned acc = 0;
    for (int it = 0; it < n; ++it) {
        if (stages == 3) asm volatile("cp.async.wait_group 1;" ::: "memory");
        else asm volatile("cp.async.wait_group 2;" ::: "memory");
        __syncthreads();
        if (it + stages - 1 < n) issue(it + stages - 1);
        else asm volatile("cp.async.commit_group;" ::: "memory");
        acc ^= *(volatile unsigned*)(ring + (it % stages) * 2 * step + threadIdx.x * 4);
    }
    if (acc == 0x12345678u) out[0] = acc;
}
