// The emulation prelude: the same names as prelude_amdgcn.hip, implemented in
// standard C++20 so the HIP templates run on the CPU (tests only; see
// ARCHITECTURE.md, "How the HIP kernels are checked"). Every work-item is a
// thread; the 64 lanes of a wavefront meet at a barrier wherever the hardware
// exchanges data between them (MFMA, lane exchange), and `mfma16` computes
// from the documented operand layout of v_mfma_f32_16x16x16 (AMD's matrix
// instruction calculator): so the template's index arithmetic, its lane
// exchanges and its online normalisation run as written, only the matrix
// unit is a reference routine.
#include <math.h>
#include <stdlib.h>
#include <atomic>
#include <barrier>
#include <memory>
#include <thread>
#include <vector>

#define __device__
#define __global__
#define __shared__ static
#define __forceinline__ inline
#define KERNEL extern "C"
#define LAUNCH_BOUNDS(n)
#define TID_X (aec_emu::t_tid)
#define BID_X (aec_emu::t_bx)
#define BID_Y (aec_emu::t_by)
#define BID_Z (aec_emu::t_bz)
#define NBLK_X (aec_emu::g_nblk_x)
#define NBLK_Z (aec_emu::g_nblk_z)

struct acc4 {
    float v[4];
    float& operator[](int i) { return v[i]; }
    float operator[](int i) const { return v[i]; }
};
struct u16x8 {
    unsigned short v[8];
    unsigned short& operator[](int i) { return v[i]; }
    unsigned short operator[](int i) const { return v[i]; }
};
struct frag4 {
    unsigned short v[4];
};

namespace aec_emu {
constexpr int kWave = 64;
static_assert(WAVE == kWave, "the emulation models 64-lane wavefronts");
struct Wave {
    std::barrier<> bar{kWave};
    int xi[kWave];
    frag4 a[kWave], b[kWave];
};
struct Block {
    explicit Block(int nt) : bar(nt) {
        for (int w = 0; w < nt / kWave; ++w) waves.push_back(std::make_unique<Wave>());
    }
    std::barrier<> bar;
    std::vector<std::unique_ptr<Wave>> waves;
};
inline thread_local int t_tid, t_bx, t_by, t_bz;
inline thread_local Block* t_block;
inline int g_nblk_x, g_nblk_z;
inline Wave& wave() { return *t_block->waves[t_tid / kWave]; }
inline int lane() { return t_tid % kWave; }

// Runs `kernel` over a (gx, gy, gz) grid of nt-thread blocks, one block at a
// time (so `static` stands for LDS), all nt work-items of a block at once.
template <class F>
void launch(int gx, int gy, int gz, int nt, F kernel) {
    Block block(nt);
    g_nblk_x = gx;
    g_nblk_z = gz;
    std::vector<std::thread> threads;
    for (int t = 0; t < nt; ++t)
        threads.emplace_back([&, t] {
            t_tid = t;
            t_block = &block;
            for (int z = 0; z < gz; ++z)
                for (int y = 0; y < gy; ++y)
                    for (int x = 0; x < gx; ++x) {
                        t_bx = x;
                        t_by = y;
                        t_bz = z;
                        kernel();
                        block.bar.arrive_and_wait();
                    }
        });
    for (auto& th : threads) th.join();
}
}  // namespace aec_emu

inline float to_f32(unsigned short x);

inline void block_sync() { aec_emu::t_block->bar.arrive_and_wait(); }

// D = A·B + C over the wave: lane l gives A[l % 16][4·(l / 16) + e] and
// B[4·(l / 16) + e][l % 16] and gets D[4·(l / 16) + e][l % 16].
inline acc4 mfma16(frag4 a, frag4 b, acc4 c) {
    aec_emu::Wave& w = aec_emu::wave();
    const int l = aec_emu::lane();
    w.a[l] = a;
    w.b[l] = b;
    w.bar.arrive_and_wait();
    acc4 d = c;
    for (int e = 0; e < 4; ++e) {
        const int row = 4 * (l / 16) + e, col = l % 16;
        float s = 0.0f;
        for (int k = 0; k < 16; ++k)
            s += to_f32(w.a[row + 16 * (k / 4)].v[k % 4]) * to_f32(w.b[col + 16 * (k / 4)].v[k % 4]);
        d[e] += s;
    }
    w.bar.arrive_and_wait();
    return d;
}

inline frag4 frag_load(const unsigned short* p) { return frag4{ {p[0], p[1], p[2], p[3]} }; }
inline frag4 frag_of(unsigned short a, unsigned short b, unsigned short c, unsigned short d) { return frag4{ {a, b, c, d} }; }
inline u16x8 load8(const unsigned short* p) {
    u16x8 x;
    for (int e = 0; e < 8; ++e) x[e] = p[e];
    return x;
}
inline void store8(unsigned short* p, u16x8 x) {
    for (int e = 0; e < 8; ++e) p[e] = x[e];
}
inline u16x8 zero8() { return u16x8{ {0, 0, 0, 0, 0, 0, 0, 0} }; }
inline void store4(unsigned short* p, unsigned short a, unsigned short b, unsigned short c, unsigned short d) {
    p[0] = a;
    p[1] = b;
    p[2] = c;
    p[3] = d;
}

inline int lane_xor_i(int x, int m) {
    aec_emu::Wave& w = aec_emu::wave();
    const int l = aec_emu::lane();
    w.xi[l] = x;
    w.bar.arrive_and_wait();
    const int r = w.xi[l ^ m];
    w.bar.arrive_and_wait();
    return r;
}
inline float lane_xor_f(float x, int m) { return __builtin_bit_cast(float, lane_xor_i(__builtin_bit_cast(int, x), m)); }
inline float lane_read_f(float x, int src) {
    aec_emu::Wave& w = aec_emu::wave();
    const int l = aec_emu::lane();
    w.xi[l] = __builtin_bit_cast(int, x);
    w.bar.arrive_and_wait();
    const int r = w.xi[src];
    w.bar.arrive_and_wait();
    return __builtin_bit_cast(float, r);
}

inline float atomicAdd(float* p, float v) { return std::atomic_ref<float>(*p).fetch_add(v); }
inline int atomic_min_shared(int* p, int v) {
    std::atomic_ref<int> a(*p);
    int old = a.load();
    while (v < old && !a.compare_exchange_weak(old, v)) {
    }
    return old;
}
inline int atomic_max_shared(int* p, int v) {
    std::atomic_ref<int> a(*p);
    int old = a.load();
    while (v > old && !a.compare_exchange_weak(old, v)) {
    }
    return old;
}

inline float fast_exp2(float x) { return exp2f(x); }
inline float __log2f(float x) { return log2f(x); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float x, float y) { return x / y; }
inline float fast_tanh(float x) { return tanhf(x); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline int max(int x, int y) { return x > y ? x : y; }
inline int min(int x, int y) { return x < y ? x : y; }
inline float __int_as_float(int x) { return __builtin_bit_cast(float, x); }
inline double __longlong_as_double(long long x) { return __builtin_bit_cast(double, x); }
