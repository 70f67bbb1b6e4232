// Uses all of its dynamic shared memory, so a launch only succeeds when the
// kernel was opted in to that much.
extern "C" __global__ void smem_sum(const float* __restrict__ x, float* __restrict__ out,
                                    unsigned n_floats) {
    extern __shared__ float buf[];
    for (unsigned i = threadIdx.x; i < n_floats; i += blockDim.x) buf[i] = x[i % 1024];
    __syncthreads();
    if (threadIdx.x == 0) {
        float s = 0.f;
        for (unsigned i = 0; i < n_floats; ++i) s += buf[i];
        out[0] = s;
    }
}
