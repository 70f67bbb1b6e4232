// The amdgcn prelude: everything the HIP templates call, written with clang's
// AMDGPU builtins only, so a kernel needs no HIP headers or device libraries
// (`-nogpuinc -nogpulib`) and compiles alike with ROCm's hipcc and a plain
// clang for gfx90a, gfx940 and gfx942. Wavefronts are 64 lanes (WAVE).
#define __device__ __attribute__((device))
#define __global__ __attribute__((global))
#define __shared__ __attribute__((shared))
#define __forceinline__ inline __attribute__((always_inline))
#define KERNEL extern "C" __global__
#define LAUNCH_BOUNDS(n) __attribute__((amdgpu_flat_work_group_size(1, n)))
#define TID_X ((int)__builtin_amdgcn_workitem_id_x())
#define BID_X ((int)__builtin_amdgcn_workgroup_id_x())
#define BID_Y ((int)__builtin_amdgcn_workgroup_id_y())
#define BID_Z ((int)__builtin_amdgcn_workgroup_id_z())
// Blocks along x and z, from the dispatch packet (grid and workgroup size in work-items).
#define NBLK_X ((int)(((const unsigned*)__builtin_amdgcn_dispatch_ptr())[3] / ((const unsigned short*)__builtin_amdgcn_dispatch_ptr())[2]))
#define NBLK_Z ((int)(((const unsigned*)__builtin_amdgcn_dispatch_ptr())[5] / ((const unsigned short*)__builtin_amdgcn_dispatch_ptr())[4]))

// MFMA operands: four 16-bit elements per lane; accumulators: four f32.
typedef float acc4 __attribute__((ext_vector_type(4)));
typedef unsigned short u16x8 __attribute__((ext_vector_type(8)));
{% if h.f16 %}typedef _Float16 frag4 __attribute__((ext_vector_type(4)));
{% else %}typedef short frag4 __attribute__((ext_vector_type(4)));
{% endif %}
__device__ __forceinline__ void block_sync() {
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
    __builtin_amdgcn_s_barrier();
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}

// d = a·b + c for one 16x16x16 tile (v_mfma_f32_16x16x16{{ h.mfma_suffix }}). Lane l holds
// A[l % 16][4·(l / 16) + e], B[4·(l / 16) + e][l % 16] and D[4·(l / 16) + e][l % 16].
__device__ __forceinline__ acc4 mfma16(frag4 a, frag4 b, acc4 c) {
    return {{ h.mfma_builtin }}(a, b, c, 0, 0, 0);
}

__device__ __forceinline__ frag4 frag_load(const unsigned short* p) { return *reinterpret_cast<const frag4*>(p); }
__device__ __forceinline__ frag4 frag_of(unsigned short a, unsigned short b, unsigned short c, unsigned short d) {
    short s[4] = {(short)a, (short)b, (short)c, (short)d};
    return __builtin_bit_cast(frag4, s);
}
__device__ __forceinline__ u16x8 load8(const unsigned short* p) { return *reinterpret_cast<const u16x8*>(p); }
__device__ __forceinline__ void store8(unsigned short* p, u16x8 x) { *reinterpret_cast<u16x8*>(p) = x; }
__device__ __forceinline__ u16x8 zero8() { return u16x8{0, 0, 0, 0, 0, 0, 0, 0}; }
__device__ __forceinline__ void store4(unsigned short* p, unsigned short a, unsigned short b, unsigned short c, unsigned short d) {
    typedef unsigned short u16x4 __attribute__((ext_vector_type(4)));
    *reinterpret_cast<u16x4*>(p) = u16x4{a, b, c, d};
}

// Lane exchange inside the wave (ds_bpermute: any lane, no LDS allocation).
__device__ __forceinline__ int lane_xor_i(int x, int m) {
    const int lane = TID_X % WAVE;
    return __builtin_amdgcn_ds_bpermute((lane ^ m) << 2, x);
}
__device__ __forceinline__ float lane_xor_f(float x, int m) {
    return __builtin_bit_cast(float, lane_xor_i(__builtin_bit_cast(int, x), m));
}
// Lane `src`'s x (any lane of the wave).
__device__ __forceinline__ float lane_read_f(float x, int src) {
    return __builtin_bit_cast(float, __builtin_amdgcn_ds_bpermute(src << 2, __builtin_bit_cast(int, x)));
}

// f32 atomic add in global memory (hardware float atomics where the target
// has them; the compile uses -munsafe-fp-atomics, valid for hipMalloc memory).
__device__ __forceinline__ float atomicAdd(float* p, float v) {
    return __hip_atomic_fetch_add(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
__device__ __forceinline__ int atomic_min_shared(int* p, int v) { return __atomic_fetch_min(p, v, __ATOMIC_RELAXED); }
__device__ __forceinline__ int atomic_max_shared(int* p, int v) { return __atomic_fetch_max(p, v, __ATOMIC_RELAXED); }

// The math the generated expressions call (cxx/spelling.rs), on the hardware's
// transcendental unit (v_exp_f32, v_log_f32, v_rcp_f32: ~1 ulp).
__device__ __forceinline__ float fast_exp2(float x) {
#if __has_builtin(__builtin_amdgcn_exp2f)
    return __builtin_amdgcn_exp2f(x);
#else
    return __builtin_exp2f(x);
#endif
}
__device__ __forceinline__ float __log2f(float x) {
#if __has_builtin(__builtin_amdgcn_logf)
    return __builtin_amdgcn_logf(x);
#else
    return __builtin_log2f(x);
#endif
}
__device__ __forceinline__ float __expf(float x) { return fast_exp2(x * 1.4426950408889634f); }
__device__ __forceinline__ float __logf(float x) { return __log2f(x) * 0.6931471805599453f; }
__device__ __forceinline__ float __fdividef(float x, float y) { return x * __builtin_amdgcn_rcpf(y); }
// No tanh instruction: 1 − 2 / (e^{2x} + 1), saturating to ±1 through inf and 0.
__device__ __forceinline__ float fast_tanh(float x) {
    return 1.0f - 2.0f * __builtin_amdgcn_rcpf(fast_exp2(x * 2.8853900817779268f) + 1.0f);
}
__device__ __forceinline__ float sqrtf(float x) { return __builtin_sqrtf(x); }
__device__ __forceinline__ float rsqrtf(float x) { return __builtin_amdgcn_rsqf(x); }
__device__ __forceinline__ float fmaxf(float x, float y) { return __builtin_fmaxf(x, y); }
__device__ __forceinline__ float fminf(float x, float y) { return __builtin_fminf(x, y); }
__device__ __forceinline__ float fabsf(float x) { return __builtin_fabsf(x); }
__device__ __forceinline__ float fmaf(float x, float y, float z) { return __builtin_fmaf(x, y, z); }
// x^y for x > 0 (the exp2/log2 identity).
__device__ __forceinline__ float powf(float x, float y) { return fast_exp2(y * __log2f(x)); }
__device__ __forceinline__ int abs(int x) { return x < 0 ? -x : x; }
__device__ __forceinline__ int max(int x, int y) { return x > y ? x : y; }
__device__ __forceinline__ int min(int x, int y) { return x < y ? x : y; }
__device__ __forceinline__ float __int_as_float(int x) { return __builtin_bit_cast(float, x); }
// Doubles of the mask's interval classification (cxx/intervals.rs): min, max
// and NaN tests are exact; the transcendental bounds go through f32, as the
// per-score mask itself does.
__device__ __forceinline__ double __longlong_as_double(long long x) { return __builtin_bit_cast(double, x); }
__device__ __forceinline__ bool isnan(double x) { return __builtin_isnan(x); }
__device__ __forceinline__ double fmin(double x, double y) { return __builtin_fmin(x, y); }
__device__ __forceinline__ double fmax(double x, double y) { return __builtin_fmax(x, y); }
__device__ __forceinline__ double sqrt(double x) { return __builtin_sqrt(x); }
__device__ __forceinline__ double exp(double x) { return (double)__expf((float)x); }
__device__ __forceinline__ double exp2(double x) { return (double)fast_exp2((float)x); }
__device__ __forceinline__ double log(double x) { return (double)__logf((float)x); }
__device__ __forceinline__ double log2(double x) { return (double)__log2f((float)x); }
__device__ __forceinline__ double tanh(double x) { return (double)fast_tanh((float)x); }
