// The spinning kernel of bench/launch_probe.py (see there).
__device__ __forceinline__ unsigned long long gt() { unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }
extern "C" __global__ void __launch_bounds__(128, 1) spin(unsigned long long* out, unsigned long long ns, int pdl) {
    extern __shared__ char s[];
    if (pdl) asm volatile("griddepcontrol.wait;" ::: "memory");
    unsigned long long t0 = gt();
    if (threadIdx.x == 0) s[0] = 1;
    while (gt() - t0 < ns) {}
    if (pdl) asm volatile("griddepcontrol.launch_dependents;");
    unsigned long long t1 = gt();
    if (threadIdx.x == 0 && out) {
        unsigned sm; asm("mov.u32 %0, %%smid;" : "=r"(sm));
        int b = blockIdx.x + gridDim.x * blockIdx.y;
        out[3 * b] = t0; out[3 * b + 1] = t1; out[3 * b + 2] = sm + s[0] * 0;
    }
}
