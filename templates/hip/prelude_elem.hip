// The element type's conversions (shared by the amdgcn and emulation
// preludes): elem_t holds the 16 bits of a {{ h.elem }} value.
typedef unsigned short elem_t;
{% if h.f16 %}__device__ __forceinline__ float to_f32(elem_t x) { return (float)__builtin_bit_cast(_Float16, x); }
__device__ __forceinline__ elem_t from_f32(float x) { return __builtin_bit_cast(elem_t, (_Float16)x); }
{% else %}__device__ __forceinline__ float to_f32(elem_t x) { return __builtin_bit_cast(float, (unsigned)x << 16); }
// Round to nearest even; NaN stays NaN.
__device__ __forceinline__ elem_t from_f32(float x) {
    const unsigned u = __builtin_bit_cast(unsigned, x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (elem_t)0x7fc0u;
    return (elem_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
{% endif %}
