"""Hand patch of the generated MLA latent decoding kernel (decode-mla-b16-h128-kv4096-d576-v512): KV splits 2j and 2j+1 as one
thread-block cluster, merged over distributed shared memory before their partial row is stored (bench/NOTES.md session 70;
rejected: the ld.shared::cluster reads of a CTA's 64 KB cost ~2.5 us). Usage: python patch.py <generated .cu>, then nvcc -arch=sm_90a -cubin."""
import sys
p = sys.argv[1]
s = open(p).read()

def rep(a, b, n=1):
    global s
    assert s.count(a) == n, (a, s.count(a))
    s = s.replace(a, b)

rep("#include <cuda_bf16.h>\n", """#include <cuda_bf16.h>
__device__ __forceinline__ unsigned cluster_ctarank() { unsigned r; asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r)); return r; }
__device__ __forceinline__ void cluster_arrive_release() { asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory"); }
__device__ __forceinline__ void cluster_wait_acquire() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }
__device__ __forceinline__ unsigned cluster_map_shared(unsigned addr, unsigned rank) { unsigned r; asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank)); return r; }
__device__ __forceinline__ float4 ld_cluster_f4(unsigned addr) { float4 v; asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr) : "memory"); return v; }
__device__ __forceinline__ float ld_cluster_f32(unsigned addr) { float v; asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(addr) : "memory"); return v; }
""")
rep('extern "C" __global__ void __launch_bounds__(NT, 1) aec_fwd_mladecode',
    'extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(NT, 1) aec_fwd_mladecode')

merge = r"""
    // PAIR: splits 2j and 2j+1 of a row block are one cluster; each keeps
    // half of every warpgroup's columns and merges the twin's half into it.
    const bool paired = n_splits % 2 == 0;
    const unsigned crank = cluster_ctarank();
    constexpr int HALF = EPI_DT / 2;
    if (paired) {
        float pofr[NR];
#pragma unroll
        for (int r = 0; r < NR; ++r) {
            pofr[r] = 1.0f;
#if ROW_MAX_HELD
            if (seen[r]) {
                float pst[NSTATE_ARR];
                held_final_state(st[r], mx[r], pst, P);
                pofr[r] = combine_rescale(st[r], pst, P);
#pragma unroll
                for (int f = 0; f < NSTATE_ARR; ++f) st[r][f] = pst[f];
            }
#endif
        }
#pragma unroll
        for (int dt = 0; dt < HALF; ++dt)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const float lo = acc[0][dt][c], hi = acc[0][dt + HALF][c];
                acc[0][dt][c] = crank ? hi : lo;
                acc[0][dt + HALF][c] = crank ? lo : hi;
            }
        float* scratch = reinterpret_cast<float*>(sK);
        constexpr int NST = NR * (NSTATE_ARR + 1);
        {
            float4* o_out = reinterpret_cast<float4*>(scratch) + tid;
#pragma unroll
            for (int dt = 0; dt < HALF; ++dt)
                o_out[dt * NT] = make_float4(acc[0][dt + HALF][0] * pofr[0], acc[0][dt + HALF][1] * pofr[0],
                                             acc[0][dt + HALF][2] * pofr[1], acc[0][dt + HALF][3] * pofr[1]);
            float* s_out = scratch + HALF * NT * 4 + tid;
#pragma unroll
            for (int r = 0; r < NR; ++r) {
#pragma unroll
                for (int f = 0; f < NSTATE_ARR; ++f) s_out[(r * (NSTATE_ARR + 1) + f) * NT] = st[r][f];
                s_out[(r * (NSTATE_ARR + 1) + NSTATE_ARR) * NT] = seen[r] ? 1.0f : 0.0f;
            }
        }
        cluster_arrive_release();
        cluster_wait_acquire();
        const unsigned peer = cluster_map_shared(smem_u32(scratch), crank ^ 1u);
        float4 tw[HALF];
#pragma unroll
        for (int dt = 0; dt < HALF; ++dt) tw[dt] = ld_cluster_f4(peer + (unsigned)((dt * NT + tid) * 16));
        float xs[NR][NSTATE_ARR];
        bool sn[NR];
#pragma unroll
        for (int r = 0; r < NR; ++r) {
#pragma unroll
            for (int f = 0; f < NSTATE_ARR; ++f) xs[r][f] = ld_cluster_f32(peer + (unsigned)((HALF * NT * 4 + (r * (NSTATE_ARR + 1) + f) * NT + tid) * 4));
            sn[r] = ld_cluster_f32(peer + (unsigned)((HALF * NT * 4 + (r * (NSTATE_ARR + 1) + NSTATE_ARR) * NT + tid) * 4)) != 0.0f;
        }
        cluster_arrive_release();  // done with the twin's shared memory
#pragma unroll
        for (int r = 0; r < NR; ++r) {
            float m[NSTATE_ARR], merged[NSTATE_ARR];
#pragma unroll
            for (int f = 0; f < NSTATE_ARR; ++f) merged[f] = xs[r][f];
            combine_merge(merged, st[r]);
#pragma unroll
            for (int f = 0; f < NSTATE_ARR; ++f) m[f] = seen[r] ? (sn[r] ? merged[f] : st[r][f]) : xs[r][f];
            const bool any = seen[r] || sn[r];
            float c_mine = 0.0f, c_twin = 0.0f;
            if (any) {
                float acc_st[NSTATE_ARR], y[NSTATE_ARR];
#pragma unroll
                for (int f = 0; f < NSTATE_ARR; ++f) acc_st[f] = 0.0f;
                const float cm = combine_rescale(st[r], m, P), ct = combine_rescale(xs[r], m, P);
                c_mine = seen[r] ? cm : 0.0f;
                c_twin = sn[r] ? ct : 0.0f;
#pragma unroll
                for (int f = 0; f < NSTATE_ARR; ++f) y[f] = seen[r] ? st[r][f] : 0.0f;
                combine_scaled_add(acc_st, c_mine, y);
#pragma unroll
                for (int f = 0; f < NSTATE_ARR; ++f) y[f] = sn[r] ? xs[r][f] : 0.0f;
                combine_scaled_add(acc_st, c_twin, y);
                combine_scaled_finish(m, acc_st);
            }
            const float cmine = c_mine * pofr[r];
#pragma unroll
            for (int dq = 0; dq < HALF; ++dq) {
                const float t0 = r == 0 ? tw[dq].x : tw[dq].z, t1 = r == 0 ? tw[dq].y : tw[dq].w;
                acc[0][dq][2 * r] = cmine * acc[0][dq][2 * r] + c_twin * t0;
                acc[0][dq][2 * r + 1] = cmine * acc[0][dq][2 * r + 1] + c_twin * t1;
            }
#pragma unroll
            for (int f = 0; f < NSTATE_ARR; ++f) st[r][f] = m[f];
            seen[r] = any;
        }
    }

    AEC_MARK(2);
"""
rep("\n    AEC_MARK(2);\n", merge)
rep("                if (seen[r]) {\n                    held_final_state(st[r], mx[r], pst, P);\n                    pof = combine_rescale(st[r], pst, P);",
    "                if (seen[r] && !paired) {\n                    held_final_state(st[r], mx[r], pst, P);\n                    pof = combine_rescale(st[r], pst, P);")
rep("                float* prow = opart + ((long long)split * rows + row) * DVG + dv0 + EPI_COL;\n#pragma unroll\n                for (int dt = 0; dt < EPI_DT; ++dt)\n",
    "                float* prow = opart + ((long long)(paired ? split / 2 : split) * rows + row) * DVG + dv0 + EPI_COL + (paired ? crank * HALF * 8 : 0);\n#pragma unroll\n                for (int dt = 0; dt < EPI_DT; ++dt)\n                    if (!paired || dt < HALF)\n")
rep("                if (t4 == 0 && dv0 == 0 && EPI_COL == 0) {\n                    float* srow = spart + ((long long)split * rows",
    "                if (t4 == 0 && dv0 == 0 && EPI_COL == 0 && (!paired || crank == 0)) {\n                    float* srow = spart + ((long long)(paired ? split / 2 : split) * rows")
rep("        AEC_MARK(3);\n\n    }\n    AEC_MARK(5);\n", "        AEC_MARK(3);\n\n    }\n    if (n_splits % 2 == 0) cluster_wait_acquire();  // the twin has read this block's half\n    AEC_MARK(5);\n")
rep("    combine_row_lanes<COMBINE_CHUNK, false>(", "    if (n_splits % 2 == 0) n_splits /= 2;  // PAIR: one partial per split pair\n    combine_row_lanes<COMBINE_CHUNK, false>(")
open(p, "w").write(s)
