// One warp: C[16x8] (f32, row-major) = A[16x16] (bf16, row-major) · B[16x8]
// (bf16, column-major) with one tensor-core mma.sync, plus a bf16 conversion
// kernel, so the compile checks exercise cuda_bf16.h and HMMA.
#include <cuda_bf16.h>

extern "C" __global__ void mma_bf16_m16n8k16(const __nv_bfloat16* __restrict__ a,
                                             const __nv_bfloat16* __restrict__ b,
                                             float* __restrict__ c) {
    const unsigned lane = threadIdx.x % 32;
    const unsigned g = lane / 4, t = lane % 4;
    const unsigned* a32 = reinterpret_cast<const unsigned*>(a);
    const unsigned* b32 = reinterpret_cast<const unsigned*>(b);
    // Fragments as laid out in the PTX ISA for m16n8k16 with 16-bit inputs.
    unsigned ra0 = a32[g * 8 + t], ra1 = a32[(g + 8) * 8 + t];
    unsigned ra2 = a32[g * 8 + 4 + t], ra3 = a32[(g + 8) * 8 + 4 + t];
    unsigned rb0 = b32[g * 8 + t], rb1 = b32[g * 8 + 4 + t];
    float d0 = 0.f, d1 = 0.f, d2 = 0.f, d3 = 0.f;
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
        : "r"(ra0), "r"(ra1), "r"(ra2), "r"(ra3), "r"(rb0), "r"(rb1));
    c[g * 8 + t * 2] = d0;
    c[g * 8 + t * 2 + 1] = d1;
    c[(g + 8) * 8 + t * 2] = d2;
    c[(g + 8) * 8 + t * 2 + 1] = d3;
}

extern "C" __global__ void to_bf16(const float* __restrict__ x, __nv_bfloat16* __restrict__ y,
                                   int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __float2bfloat16(x[i]);
}
