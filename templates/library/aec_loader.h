/*
 * aec_loader.h: the runtime of aec kernel libraries (written by `aec compile`
 * as DIR/include/aec_loader.h next to the generated DIR/include/aec_library.h).
 *
 * Header-only, C99 and C++ (every function is `static inline`). It needs no
 * CUDA or ROCm headers: it declares the few driver types it uses and loads
 * the GPU driver with dlopen at run time -- the CUDA driver (libcuda.so.1)
 * for NVIDIA GPUs, the HIP runtime (libamdhip64.so) for AMD GPUs -- so a
 * program built against it links only libdl (`-ldl`; part of libc on glibc
 * 2.34+) and runs wherever either is installed. Without a driver every call
 * returns a status and a message; nothing crashes. Linux/POSIX only.
 *
 *     aec_library lib;
 *     if (aec_library_open(&lib, "path/to/DIR") != AEC_OK) {
 *         fprintf(stderr, "%s\n", aec_last_error(&lib));
 *         return 1;
 *     }
 *     ... aec_<variant>_<pass>(&lib, &sizes, &buffers, NULL, NULL) ...
 *     aec_library_close(&lib);
 *
 * aec_library_open takes the first backend, of those the library has builds
 * for, whose driver loads and sees a GPU: CUDA, then HIP
 * (aec_library_open_backend names one). lib.backend says which.
 *
 * CUDA: aec_library_open uses the context current on the calling thread, or
 * retains device 0's primary context (the one the CUDA runtime and PyTorch
 * use) and makes it current. Later calls run in that context: on a thread
 * with no current context they make it current; on a thread with another
 * context current they refuse (AEC_ERROR_ARGUMENT).
 *
 * HIP: aec_library_open uses the calling thread's current device
 * (hipSetDevice picks it). Later calls refuse (AEC_ERROR_ARGUMENT) on a
 * thread whose current device is another one.
 *
 * An aec_library caches the modules and functions it loads: use one
 * aec_library per thread, or serialise calls on a shared one.
 *
 * Device pointers are passed as `void*` (a CUdeviceptr cast to a pointer, or
 * a HIP device pointer), streams as `void*` (a CUstream or hipStream_t; NULL
 * is the default stream).
 */
#ifndef AEC_LOADER_H
#define AEC_LOADER_H

#define AEC_LOADER_VERSION 3

#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes: every function returns one; aec_last_error says more. */
enum {
    AEC_OK = 0,
    /* A NULL pointer where one is required, a misaligned workspace, a
       library that is not open, another CUDA context or HIP device current. */
    AEC_ERROR_ARGUMENT = 1,
    /* Sizes that break the plan: below 1, a fixed size with another value,
       a broken multiple-of/equal rule, head dims the library lacks, a grid
       over the launch limits. */
    AEC_ERROR_SHAPE = 2,
    /* No kernel for this GPU's architecture in the library. */
    AEC_ERROR_NO_KERNEL = 3,
    /* No driver of the backends tried could be loaded (libcuda.so.1 for
       CUDA, libamdhip64.so for HIP). */
    AEC_ERROR_NO_DRIVER = 4,
    /* A driver call failed, or a driver loaded but sees no GPU (the message
       names the call and the error). */
    AEC_ERROR_DRIVER = 5,
    /* The library directory or a code object could not be read. */
    AEC_ERROR_FILE = 6,
    /* A host allocation failed. */
    AEC_ERROR_MEMORY = 7
};

/* What aec_<variant>_<pass>_workspace_bytes returns for sizes it cannot
   run (the call itself says why). */
#define AEC_WORKSPACE_INVALID ((size_t)-1)

/* Workspace sub-buffers start at multiples of this many bytes; a workspace
   given to a call must be aligned to it (cuMemAlloc's and hipMalloc's are). */
#define AEC_WORKSPACE_ALIGN 256u

/* Every tensor given to a call must start at a multiple of this many bytes:
   the kernels load and store 16 bytes per lane (cp.async, vector stores).
   cuMemAlloc's and hipMalloc's allocations are; a pointer into the middle of
   one may not be. */
#define AEC_TENSOR_ALIGN 16u

/* The backends: where a library's kernels run. */
enum {
    AEC_BACKEND_AUTO = 0, /* aec_library_open_backend: the first that works */
    AEC_BACKEND_CUDA = 1, /* NVIDIA GPUs, cubins, the CUDA driver */
    AEC_BACKEND_HIP = 2   /* AMD GPUs, code objects, the HIP runtime */
};

/* The backends aec_library_open tries: aec_library.h defines it as those
   the library has builds for; alone, aec_loader.h tries both. */
#ifndef AEC_LIBRARY_BACKENDS
#define AEC_LIBRARY_BACKENDS (AEC_BACKEND_CUDA | AEC_BACKEND_HIP)
#endif

/* A device address as kernels take it (a CUdeviceptr, or a HIP device
   pointer's bits), and loaded modules and functions of either backend. */
typedef unsigned long long aecl_devptr;
typedef void *aecl_module_handle;
typedef void *aecl_kernel;

/* The CUDA driver types the loader uses (same layout as cuda.h). */
typedef int aecl_CUresult;
typedef int aecl_CUdevice;
typedef struct aecl_CUctx_st *aecl_CUcontext;
typedef struct aecl_CUstream_st *aecl_CUstream;

#define AECL_CUDA_SUCCESS 0
#define AECL_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT 16
#define AECL_CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR 81
#define AECL_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR 75
#define AECL_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR 76
#define AECL_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES 8

/* cuTensorMapEncodeTiled's enum values (CUtensorMapDataType, …): the ones
   the sm_90a kernels' tensor maps use. */
#define AECL_CU_TENSOR_MAP_DATA_TYPE_FLOAT16 6
#define AECL_CU_TENSOR_MAP_DATA_TYPE_FLOAT32 7
#define AECL_CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 9
#define AECL_CU_TENSOR_MAP_INTERLEAVE_NONE 0
#define AECL_CU_TENSOR_MAP_SWIZZLE_128B 3
#define AECL_CU_TENSOR_MAP_L2_PROMOTION_L2_128B 2
#define AECL_CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE 0

/* A CUtensorMap is 128 opaque bytes the driver wants 64-byte aligned (CUDA
   13's cuda.h declares it 128-byte aligned: so do we). C99 has no alignas,
   so the generated calls keep their maps in a byte array and align the
   start by hand (aecl_tensor_map_storage). */
#define AECL_TENSOR_MAP_BYTES 128u
#define AECL_TENSOR_MAP_ALIGN 128u

/* The CUDA driver entry points, loaded with dlsym (the `_v2` symbols where
   the driver exports them). */
typedef struct aecl_cuda_api {
    aecl_CUresult (*cuInit)(unsigned int);
    aecl_CUresult (*cuGetErrorName)(aecl_CUresult, const char **);
    aecl_CUresult (*cuGetErrorString)(aecl_CUresult, const char **);
    aecl_CUresult (*cuDeviceGet)(aecl_CUdevice *, int);
    aecl_CUresult (*cuDeviceGetAttribute)(int *, int, aecl_CUdevice);
    aecl_CUresult (*cuDeviceGetName)(char *, int, aecl_CUdevice);
    aecl_CUresult (*cuCtxGetCurrent)(aecl_CUcontext *);
    aecl_CUresult (*cuCtxSetCurrent)(aecl_CUcontext);
    aecl_CUresult (*cuCtxGetDevice)(aecl_CUdevice *);
    aecl_CUresult (*cuCtxSynchronize)(void);
    aecl_CUresult (*cuDevicePrimaryCtxRetain)(aecl_CUcontext *, aecl_CUdevice);
    aecl_CUresult (*cuDevicePrimaryCtxRelease)(aecl_CUdevice);
    aecl_CUresult (*cuModuleLoadData)(aecl_module_handle *, const void *);
    aecl_CUresult (*cuModuleUnload)(aecl_module_handle);
    aecl_CUresult (*cuModuleGetFunction)(aecl_kernel *, aecl_module_handle, const char *);
    aecl_CUresult (*cuFuncSetAttribute)(aecl_kernel, int, int);
    aecl_CUresult (*cuLaunchKernel)(aecl_kernel, unsigned int, unsigned int, unsigned int,
                                    unsigned int, unsigned int, unsigned int, unsigned int,
                                    aecl_CUstream, void **, void **);
    aecl_CUresult (*cuMemsetD32Async)(aecl_devptr, unsigned int, size_t, aecl_CUstream);
    aecl_CUresult (*cuMemsetD16Async)(aecl_devptr, unsigned short, size_t, aecl_CUstream);
    aecl_CUresult (*cuMemAlloc)(aecl_devptr *, size_t);
    aecl_CUresult (*cuMemFree)(aecl_devptr);
    aecl_CUresult (*cuMemcpyHtoD)(aecl_devptr, const void *, size_t);
    aecl_CUresult (*cuMemcpyDtoH)(void *, aecl_devptr, size_t);
    aecl_CUresult (*cuStreamSynchronize)(aecl_CUstream);
    aecl_CUresult (*cuOccupancyMaxActiveBlocksPerMultiprocessor)(int *, aecl_kernel, int, size_t);
    /* Optional (NULL when the driver lacks it): only libraries whose sm_90a
       kernels take tensor maps call it, and they say so when it is missing. */
    aecl_CUresult (*cuTensorMapEncodeTiled)(void *, int, uint32_t, void *, const uint64_t *, const uint64_t *,
                                            const uint32_t *, const uint32_t *, int, int, int, int);
} aecl_cuda_api;

/* The HIP runtime types the loader uses (same layout as hip_runtime_api.h,
   ROCm 5 to 7). */
typedef int aecl_hipError;
typedef struct aecl_hipStream_st *aecl_hipStream;

#define AECL_HIP_SUCCESS 0
/* hipDeviceAttribute_t values (unchanged from ROCm 5.2 to 7). */
#define AECL_HIP_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR 23
#define AECL_HIP_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR 61
#define AECL_HIP_ATTRIBUTE_MULTIPROCESSOR_COUNT 63

/* The HIP runtime entry points, loaded with dlsym. */
typedef struct aecl_hip_api {
    aecl_hipError (*hipInit)(unsigned int);
    const char *(*hipGetErrorName)(aecl_hipError);
    const char *(*hipGetErrorString)(aecl_hipError);
    aecl_hipError (*hipGetDeviceCount)(int *);
    aecl_hipError (*hipGetDevice)(int *);
    aecl_hipError (*hipDeviceGetAttribute)(int *, int, int);
    aecl_hipError (*hipDeviceGetName)(char *, int, int);
    aecl_hipError (*hipDeviceSynchronize)(void);
    aecl_hipError (*hipModuleLoadData)(aecl_module_handle *, const void *);
    aecl_hipError (*hipModuleUnload)(aecl_module_handle);
    aecl_hipError (*hipModuleGetFunction)(aecl_kernel *, aecl_module_handle, const char *);
    aecl_hipError (*hipModuleLaunchKernel)(aecl_kernel, unsigned int, unsigned int, unsigned int,
                                           unsigned int, unsigned int, unsigned int, unsigned int,
                                           aecl_hipStream, void **, void **);
    aecl_hipError (*hipMemsetD32Async)(void *, int, size_t, aecl_hipStream);
    aecl_hipError (*hipMemsetD16Async)(void *, unsigned short, size_t, aecl_hipStream);
    aecl_hipError (*hipMalloc)(void **, size_t);
    aecl_hipError (*hipFree)(void *);
    aecl_hipError (*hipMemcpyHtoD)(void *, void *, size_t);
    aecl_hipError (*hipMemcpyDtoH)(void *, void *, size_t);
    aecl_hipError (*hipStreamSynchronize)(aecl_hipStream);
} aecl_hip_api;

/* A loaded code object (one per cubin or code-object path). */
typedef struct aecl_module {
    char *path;
    aecl_module_handle module;
} aecl_module;

/* A kernel function fetched from a module, its shared-memory limit set. */
typedef struct aecl_function {
    size_t module;
    char *entry;
    aecl_kernel function;
} aecl_function;

#define AEC_ERROR_CAPACITY 1024

/* An open kernel library. Open it with aec_library_open, close it with
   aec_library_close; read the fields, never write them. */
typedef struct aec_library {
    int is_open;
    int backend;                  /* AEC_BACKEND_CUDA or AEC_BACKEND_HIP (0 until open) */
    void *driver;                 /* dlopen handle of libcuda.so.1 or libamdhip64.so */
    aecl_cuda_api cu;             /* CUDA: the driver's entry points */
    aecl_hip_api hip;             /* HIP: the runtime's entry points */
    aecl_CUcontext context;       /* CUDA: the context calls run in */
    int device;                   /* its device (HIP: the device calls run on) */
    int owns_primary_context;     /* CUDA: 1 when retained by aec_library_open */
    char device_name[128];        /* e.g. "NVIDIA H100 80GB HBM3", "AMD Instinct MI300X" */
    int cc_major, cc_minor;       /* compute capability, e.g. 9 and 0 (HIP: the gfx version, 9 and 4 for gfx942) */
    char arch[16];                /* the builds this GPU runs: "sm_90a" (9.0), "sm_80" (8.x), "sm_XY"; "gfx90a", "gfx942" */
    int sm_count;                 /* multiprocessors or compute units (the KV-split rule and persistent grids read it) */
    int smem_per_sm;              /* CUDA: shared memory per multiprocessor (the KV-split rule's wave cap); HIP: 0 */
    char *dir;                    /* the library directory */
    aecl_module *modules;         /* loaded modules */
    size_t n_modules;
    aecl_function *functions;     /* fetched functions */
    size_t n_functions;
    char error[AEC_ERROR_CAPACITY]; /* the last error message */
} aec_library;

/* ---- errors ---- */

#if defined(__GNUC__) || defined(__clang__)
#define AECL_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define AECL_PRINTF(f, a)
#endif

/* Writes the message into `err` (capacity `n`) and returns `status`. */
static inline int aecl_fail(char *err, size_t n, int status, const char *fmt, ...) AECL_PRINTF(4, 5);
static inline int aecl_fail(char *err, size_t n, int status, const char *fmt, ...)
{
    va_list ap;
    if (err != NULL && n > 0) {
        va_start(ap, fmt);
        vsnprintf(err, n, fmt, ap);
        va_end(ap);
    }
    return status;
}

/* The last error message of `lib` ("" when the last call succeeded). */
static inline const char *aec_last_error(const aec_library *lib)
{
    return lib == NULL ? "aec_last_error: the aec_library pointer is NULL" : lib->error;
}

/* The name of a status code, e.g. "AEC_ERROR_SHAPE". */
static inline const char *aec_status_name(int status)
{
    switch (status) {
    case AEC_OK: return "AEC_OK";
    case AEC_ERROR_ARGUMENT: return "AEC_ERROR_ARGUMENT";
    case AEC_ERROR_SHAPE: return "AEC_ERROR_SHAPE";
    case AEC_ERROR_NO_KERNEL: return "AEC_ERROR_NO_KERNEL";
    case AEC_ERROR_NO_DRIVER: return "AEC_ERROR_NO_DRIVER";
    case AEC_ERROR_DRIVER: return "AEC_ERROR_DRIVER";
    case AEC_ERROR_FILE: return "AEC_ERROR_FILE";
    case AEC_ERROR_MEMORY: return "AEC_ERROR_MEMORY";
    default: return "AEC_ERROR_UNKNOWN";
    }
}

/* AEC_ERROR_DRIVER with "<what> failed: CUDA_ERROR_X (its description)"
   (HIP: "hipErrorX (its description)"). */
static inline int aecl_driver_fail(aec_library *lib, int r, const char *what)
{
    const char *name = NULL, *text = NULL;
    if (lib->backend == AEC_BACKEND_HIP) {
        if (lib->hip.hipGetErrorName != NULL)
            name = lib->hip.hipGetErrorName(r);
        if (lib->hip.hipGetErrorString != NULL)
            text = lib->hip.hipGetErrorString(r);
    } else {
        if (lib->cu.cuGetErrorName == NULL || lib->cu.cuGetErrorName(r, &name) != AECL_CUDA_SUCCESS)
            name = NULL;
        if (lib->cu.cuGetErrorString == NULL || lib->cu.cuGetErrorString(r, &text) != AECL_CUDA_SUCCESS)
            text = NULL;
    }
    if (name != NULL)
        return aecl_fail(lib->error, sizeof lib->error, AEC_ERROR_DRIVER, "%s failed: %s (%s)", what,
                         name, text != NULL ? text : "no description");
    return aecl_fail(lib->error, sizeof lib->error, AEC_ERROR_DRIVER, "%s failed: %s error %d", what,
                     lib->backend == AEC_BACKEND_HIP ? "HIP" : "CUDA", r);
}

/* The name of a driver call on the library's backend (for messages). */
#define AECL_CALL(lib, cuda_name, hip_name) ((lib)->backend == AEC_BACKEND_HIP ? (hip_name) : (cuda_name))

/* ---- 64-bit size arithmetic (the generated code's SizeExprs) ---- */

static inline uint64_t aecl_mul(uint64_t a, uint64_t b, int *overflow)
{
    if (a != 0 && b > UINT64_MAX / a) {
        *overflow = 1;
        return 0;
    }
    return a * b;
}

static inline uint64_t aecl_add(uint64_t a, uint64_t b, int *overflow)
{
    if (b > UINT64_MAX - a) {
        *overflow = 1;
        return 0;
    }
    return a + b;
}

/* ceil(a / b); b = 0 counts as an overflow. */
static inline uint64_t aecl_ceil_div(uint64_t a, uint64_t b, int *overflow)
{
    if (b == 0) {
        *overflow = 1;
        return 0;
    }
    return a / b + (a % b != 0);
}

/* floor(a / b); b = 0 counts as an overflow. */
static inline uint64_t aecl_floor_div(uint64_t a, uint64_t b, int *overflow)
{
    if (b == 0) {
        *overflow = 1;
        return 0;
    }
    return a / b;
}

static inline uint64_t aecl_min(uint64_t a, uint64_t b)
{
    return a < b ? a : b;
}

/* A sequence length's tuning bucket: the next power of two (450 -> 512),
   at most 2^31, as `aec tune` keys its results. The tuning table's kernels
   are picked by it. */
static inline uint64_t aecl_bucket(int n)
{
    uint64_t p = 1;
    while (p < (uint64_t)(n < 1 ? 1 : n) && p < ((uint64_t)1 << 31))
        p <<= 1;
    return p;
}

/* Whether the library's GPU is of `product` with `sms` multiprocessors: its
   driver name contains the product's name, ignoring ASCII case ("h100" in
   "NVIDIA H100 80GB HBM3"). The untuned choices `aec compile` made for
   declared workloads are picked by it. */
static inline int aecl_is_product(const aec_library *lib, const char *product, int sms)
{
    const char *h;
    size_t i;
    if (lib->sm_count != sms)
        return 0;
    for (h = lib->device_name; *h; h++) {
        for (i = 0; product[i]; i++) {
            char a = h[i], b = product[i];
            if (a >= 'A' && a <= 'Z')
                a = (char)(a - 'A' + 'a');
            if (b >= 'A' && b <= 'Z')
                b = (char)(b - 'A' + 'a');
            if (a != b)
                break;
        }
        if (!product[i])
            return 1;
    }
    return 0;
}

static inline uint64_t aecl_align(uint64_t bytes, int *overflow)
{
    return aecl_mul(aecl_ceil_div(bytes, AEC_WORKSPACE_ALIGN, overflow), AEC_WORKSPACE_ALIGN, overflow);
}

static inline uint64_t aecl_clamp(uint64_t x, uint64_t lo, uint64_t hi)
{
    return x < lo ? lo : x > hi ? hi : x;
}

/* K/V bytes a multiprocessor needs in flight for the DRAM to run at full
   speed (KV_BYTES_IN_FLIGHT_PER_SM in compiler/src/cuda/forward/split_kv.rs). */
#define AECL_KV_BYTES_IN_FLIGHT_PER_SM (64u * 1024u)

/* The busiest multiprocessor's time with `splits` KV splits (split_cost in
   compiler/src/cuda/forward/split_kv.rs), in key blocks * 1024: n = ceil(blocks *
   splits / SMs) blocks of ceil(key_blocks / splits) key blocks plus
   `fixed` 1024ths of one (0: 1024), slower by 1 + 0.078 *
   (AECL_KV_BYTES_IN_FLIGHT_PER_SM / bytes - 1)^2 where the blocks resident
   at once (`per_sm` of them fit where `known`) keep less than
   AECL_KV_BYTES_IN_FLIGHT_PER_SM in flight (`in_flight` each; 0, not
   known: half of it). */
static inline uint64_t aecl_split_cost(uint64_t blocks, uint64_t key_blocks, uint64_t splits, uint64_t sms,
                                       int known, uint64_t per_sm, uint64_t in_flight, uint64_t fixed)
{
    uint64_t n = (blocks * splits + sms - 1) / sms;
    uint64_t per_block = (key_blocks + splits - 1) / splits * 1024u + (fixed ? fixed : 1024u);
    uint64_t together = known && per_sm < n ? per_sm : n;
    uint64_t bytes, ratio, short_by;
    if (together < 1)
        together = 1;
    bytes = together * (in_flight ? in_flight : AECL_KV_BYTES_IN_FLIGHT_PER_SM / 2);
    ratio = (uint64_t)AECL_KV_BYTES_IN_FLIGHT_PER_SM * 1024u / bytes;
    short_by = ratio > 1024u ? ratio - 1024u : 0u;
    return n * per_block / 1024u * ((1u << 20) + short_by * short_by * 80u / 1024u) / 1024u;
}

/* The KV-split rule of the launch plans (KvSplitPlan::splits): 1 when the
   grid already has 2 blocks per multiprocessor; otherwise the splits s from
   1 to min(clamp(key_blocks / 4, 1, max_splits), max(1, per_sm * SMs /
   blocks)) with the least aecl_split_cost (each block keeping `in_flight`
   K/V bytes in flight, with `fixed` work), the fewest among equals.
   per_sm, the blocks a multiprocessor holds at once: `resident` (the
   driver's count for the split launch's function, aecl_resident_blocks,
   registers included) where it is above 0; else, where block_smem and
   smem_per_sm are not 0, floor(smem_per_sm / (block_smem + 1024)), an
   upper bound of the driver's; else unknown (no wave cap). */
static inline uint64_t aecl_kv_splits(uint64_t blocks, uint64_t key_blocks, uint64_t max_splits, uint64_t block_smem,
                                      uint64_t in_flight, uint64_t fixed, int sm_count, int smem_per_sm,
                                      int resident)
{
    uint64_t sms = sm_count < 1 ? 1u : (uint64_t)sm_count;
    uint64_t top, s, best = 1, best_cost, cost, per_sm = 0, wave;
    int known = 1;
    if (blocks == 0 || blocks >= 2 * sms)
        return 1;
    top = aecl_clamp(key_blocks / 4, 1, max_splits < 1 ? 1 : max_splits);
    if (resident > 0)
        per_sm = (uint64_t)resident;
    else if (block_smem != 0 && smem_per_sm > 0)
        per_sm = (uint64_t)smem_per_sm / (block_smem + 1024);
    else
        known = 0;
    if (known) {
        wave = per_sm * sms / blocks;
        if (wave < 1)
            wave = 1;
        if (wave < top)
            top = wave;
    }
    best_cost = aecl_split_cost(blocks, key_blocks, 1, sms, known, per_sm, in_flight, fixed);
    for (s = 2; s <= top; s++) {
        cost = aecl_split_cost(blocks, key_blocks, s, sms, known, per_sm, in_flight, fixed);
        if (cost < best_cost) {
            best = s;
            best_cost = cost;
        }
    }
    return best;
}

/* AEC_ERROR_SHAPE unless 1 <= x < 2^31 and 1 <= y, z < 65536; on HIP also
   unless each dimension times the block's threads fits 32 bits (HIP's
   global work size). */
static inline int aecl_check_grid(const aec_library *lib, char *err, size_t n, const char *fn, const char *entry,
                                  const uint64_t g[3], unsigned int threads)
{
    int d;
    if (g[0] < 1 || g[0] > 2147483647u || g[1] < 1 || g[1] > 65535u || g[2] < 1 || g[2] > 65535u)
        return aecl_fail(err, n, AEC_ERROR_SHAPE,
                         "%s: the grid of kernel %s would be (%llu, %llu, %llu); CUDA and HIP allow x in "
                         "[1, 2^31 - 1] and y, z in [1, 65535]: use smaller sizes",
                         fn, entry, (unsigned long long)g[0], (unsigned long long)g[1],
                         (unsigned long long)g[2]);
    if (lib != NULL && lib->backend == AEC_BACKEND_HIP)
        for (d = 0; d < 3; d++)
            if (g[d] * threads > 4294967295u)
                return aecl_fail(err, n, AEC_ERROR_SHAPE,
                                 "%s: the grid of kernel %s would be (%llu, %llu, %llu) blocks of %u threads; "
                                 "HIP allows at most 2^32 - 1 threads along each dimension: use smaller sizes",
                                 fn, entry, (unsigned long long)g[0], (unsigned long long)g[1],
                                 (unsigned long long)g[2], threads);
    return AEC_OK;
}

/* AEC_ERROR_SHAPE unless a 32-bit kernel argument fits. */
static inline int aecl_check_i32(char *err, size_t n, const char *fn, const char *entry, const char *what, uint64_t v)
{
    if (v > 2147483647u)
        return aecl_fail(err, n, AEC_ERROR_SHAPE,
                         "%s: the argument %s of kernel %s would be %llu, more than a 32-bit int holds",
                         fn, what, entry, (unsigned long long)v);
    return AEC_OK;
}

/* AEC_ERROR_SHAPE unless a tensor map with extents `dims` (innermost
   first) over a contiguous tensor of `bytes`-byte elements is one
   cuTensorMapEncodeTiled takes: every extent in [1, 2^32], the byte strides
   dims[0] * bytes and dims[0] * dims[1] * bytes multiples of 16 below 2^40,
   and no more elements than the buffer's `elements` (the shape the plan
   gives it). */
static inline int aecl_check_tensor_map(char *err, size_t n, const char *fn, const char *entry, const char *tensor,
                                        const uint64_t dims[3], uint64_t bytes, uint64_t elements)
{
    int d, ovf = 0;
    uint64_t row, plane, all;
    for (d = 0; d < 3; d++)
        if (dims[d] < 1 || dims[d] > ((uint64_t)1 << 32))
            return aecl_fail(err, n, AEC_ERROR_SHAPE,
                             "%s: the tensor map of %s for kernel %s would have extents (%llu, %llu, %llu) "
                             "(innermost first); cuTensorMapEncodeTiled takes extents in [1, 2^32]: use smaller sizes",
                             fn, tensor, entry, (unsigned long long)dims[0], (unsigned long long)dims[1],
                             (unsigned long long)dims[2]);
    row = aecl_mul(dims[0], bytes, &ovf);
    plane = aecl_mul(row, dims[1], &ovf);
    if (ovf || row % 16 != 0 || plane % 16 != 0 || row >= ((uint64_t)1 << 40) || plane >= ((uint64_t)1 << 40))
        return aecl_fail(err, n, AEC_ERROR_SHAPE,
                         "%s: the tensor map of %s for kernel %s (extents (%llu, %llu, %llu), innermost first, "
                         "%llu-byte elements) would have byte strides %llu and %s%llu; cuTensorMapEncodeTiled takes "
                         "multiples of 16 below 2^40: use smaller sizes",
                         fn, tensor, entry, (unsigned long long)dims[0], (unsigned long long)dims[1],
                         (unsigned long long)dims[2], (unsigned long long)bytes, (unsigned long long)row,
                         ovf ? "more than " : "", ovf ? (unsigned long long)UINT64_MAX : (unsigned long long)plane);
    all = aecl_mul(aecl_mul(dims[0], dims[1], &ovf), dims[2], &ovf);
    if (ovf || all > elements)
        return aecl_fail(err, n, AEC_ERROR_SHAPE,
                         "%s: the tensor map of %s for kernel %s (extents (%llu, %llu, %llu)) would cover more "
                         "than the buffer's %llu elements: the library's launch plan is inconsistent",
                         fn, tensor, entry, (unsigned long long)dims[0], (unsigned long long)dims[1],
                         (unsigned long long)dims[2], (unsigned long long)elements);
    return AEC_OK;
}

/* The first AECL_TENSOR_MAP_ALIGN-aligned byte of `storage`: with
   n * AECL_TENSOR_MAP_BYTES + AECL_TENSOR_MAP_ALIGN - 1 bytes there, n maps
   fit from it on. */
static inline unsigned char *aecl_tensor_map_storage(unsigned char *storage)
{
    uintptr_t off = (uintptr_t)storage % AECL_TENSOR_MAP_ALIGN;
    return storage + (off == 0 ? 0 : AECL_TENSOR_MAP_ALIGN - off);
}

static inline aecl_devptr aecl_dptr(const void *p)
{
    return (aecl_devptr)(uintptr_t)p;
}

static inline void *aecl_hptr(aecl_devptr p)
{
    return (void *)(uintptr_t)p;
}

/* ---- opening and closing ---- */

static inline char *aecl_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = (char *)malloc(n);
    if (d != NULL)
        memcpy(d, s, n);
    return d;
}

/* DIR "/" REL, malloc'd (NULL when out of memory). */
static inline char *aecl_join(const char *dir, const char *rel)
{
    size_t a = strlen(dir), b = strlen(rel);
    char *p = (char *)malloc(a + b + 2);
    if (p == NULL)
        return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, rel, b + 1);
    return p;
}

/* Appends `src` to the string in `dst` (capacity `cap`), cut to fit. */
static inline void aecl_append(char *dst, size_t cap, const char *src)
{
    size_t n = strlen(dst);
    while (*src != '\0' && n + 1 < cap)
        dst[n++] = *src++;
    dst[n] = '\0';
}

/* Closes `lib`: unloads its modules, releases the primary context it
   retained (CUDA), unloads the driver. Safe on a library whose open failed
   and on a closed one. */
static inline void aec_library_close(aec_library *lib)
{
    size_t i;
    if (lib == NULL)
        return;
    if (lib->is_open && lib->backend == AEC_BACKEND_CUDA) {
        aecl_CUcontext cur = NULL;
        if (lib->cu.cuCtxGetCurrent(&cur) == AECL_CUDA_SUCCESS && cur == NULL)
            lib->cu.cuCtxSetCurrent(lib->context);
        for (i = 0; i < lib->n_modules; i++)
            lib->cu.cuModuleUnload(lib->modules[i].module);
        if (lib->owns_primary_context)
            lib->cu.cuDevicePrimaryCtxRelease(lib->device);
    } else if (lib->is_open && lib->backend == AEC_BACKEND_HIP) {
        for (i = 0; i < lib->n_modules; i++)
            lib->hip.hipModuleUnload(lib->modules[i].module);
    }
    for (i = 0; i < lib->n_modules; i++)
        free(lib->modules[i].path);
    for (i = 0; i < lib->n_functions; i++)
        free(lib->functions[i].entry);
    free(lib->modules);
    free(lib->functions);
    free(lib->dir);
    if (lib->driver != NULL)
        dlclose(lib->driver);
    memset(lib, 0, sizeof *lib);
}

/* Resolves `n` symbols of lib->driver into `slots` (function pointers, in
   order); AEC_ERROR_DRIVER naming the first one missing. */
static inline int aecl_resolve(aec_library *lib, const char *const *names, void **slots, size_t n,
                               const char *library, const char *too_old)
{
    size_t i;
    for (i = 0; i < n; i++) {
        /* dlsym gives object pointers; copy their bits into the function
           pointers (POSIX guarantees they have the same representation). */
        void *sym = dlsym(lib->driver, names[i]);
        if (sym == NULL)
            return aecl_fail(lib->error, sizeof lib->error, AEC_ERROR_DRIVER,
                             "aec_library_open: %s lacks %s: %s", library, names[i], too_old);
        memcpy(&slots[i], &sym, sizeof sym);
    }
    return AEC_OK;
}

/* The API tables are arrays of function pointers filled in order (CUDA: 25
   required, then the optional cuTensorMapEncodeTiled). */
typedef char aecl_cuda_api_is_26_pointers[sizeof(aecl_cuda_api) == 26 * sizeof(void (*)(void)) ? 1 : -1];
typedef char aecl_hip_api_is_19_pointers[sizeof(aecl_hip_api) == 19 * sizeof(void (*)(void)) ? 1 : -1];

/* Loads every CUDA driver entry point. */
static inline int aecl_load_cuda_api(aec_library *lib)
{
    static const char *const names[] = {
        "cuInit", "cuGetErrorName", "cuGetErrorString", "cuDeviceGet", "cuDeviceGetAttribute",
        "cuDeviceGetName", "cuCtxGetCurrent", "cuCtxSetCurrent", "cuCtxGetDevice",
        "cuCtxSynchronize", "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRelease_v2",
        "cuModuleLoadData", "cuModuleUnload", "cuModuleGetFunction", "cuFuncSetAttribute",
        "cuLaunchKernel", "cuMemsetD32Async", "cuMemsetD16Async", "cuMemAlloc_v2", "cuMemFree_v2",
        "cuMemcpyHtoD_v2", "cuMemcpyDtoH_v2", "cuStreamSynchronize",
        "cuOccupancyMaxActiveBlocksPerMultiprocessor",
    };
    /* The fields of aecl_cuda_api in the order of `names`. */
    void *slots[sizeof names / sizeof names[0]];
    void *encode;
    int status = aecl_resolve(lib, names, slots, sizeof names / sizeof names[0], "libcuda.so.1",
                              "the NVIDIA driver is too old (CUDA 12 or newer is needed)");
    if (status != AEC_OK)
        return status;
    memcpy(&lib->cu, slots, sizeof slots);
    /* Missing from drivers before CUDA 12; a call that needs it says so. */
    encode = dlsym(lib->driver, "cuTensorMapEncodeTiled");
    memcpy(&lib->cu.cuTensorMapEncodeTiled, &encode, sizeof encode);
    return AEC_OK;
}

/* Loads every HIP runtime entry point. */
static inline int aecl_load_hip_api(aec_library *lib)
{
    static const char *const names[] = {
        "hipInit", "hipGetErrorName", "hipGetErrorString", "hipGetDeviceCount", "hipGetDevice",
        "hipDeviceGetAttribute", "hipDeviceGetName", "hipDeviceSynchronize", "hipModuleLoadData",
        "hipModuleUnload", "hipModuleGetFunction", "hipModuleLaunchKernel", "hipMemsetD32Async",
        "hipMemsetD16Async", "hipMalloc", "hipFree", "hipMemcpyHtoD", "hipMemcpyDtoH",
        "hipStreamSynchronize",
    };
    /* The fields of aecl_hip_api in the order of `names`. */
    void *slots[sizeof names / sizeof names[0]];
    int status = aecl_resolve(lib, names, slots, sizeof names / sizeof names[0], "libamdhip64.so",
                              "the ROCm installation is too old (ROCm 5.2 or newer is needed)");
    if (status != AEC_OK)
        return status;
    memcpy(&lib->hip, slots, sizeof lib->hip);
    return AEC_OK;
}

/* What a backend's open gives when its driver is absent or sees no GPU
   (aec_library_open then tries the next backend). */
#define AECL_ABSENT (-1)

/* Opens the CUDA backend: AEC_OK, AECL_ABSENT (no libcuda.so.1: NO_DRIVER
   in `*absent_status`; cuInit failed: DRIVER), or an error status. */
static inline int aecl_open_cuda(aec_library *lib, int *absent_status)
{
    aecl_CUresult r;
    aecl_CUcontext cur = NULL;
    int v = 0, status;
    lib->backend = AEC_BACKEND_CUDA;
    lib->driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib->driver == NULL) {
        const char *why = dlerror();
        aecl_fail(lib->error, sizeof lib->error, AEC_ERROR_NO_DRIVER,
                  "aec_library_open: libcuda.so.1 not found: the NVIDIA driver is not installed "
                  "or not on the library path (dlopen: %s); the library's CUDA kernels need an NVIDIA GPU "
                  "and its driver",
                  why != NULL ? why : "dlopen failed");
        *absent_status = AEC_ERROR_NO_DRIVER;
        return AECL_ABSENT;
    }
    if ((status = aecl_load_cuda_api(lib)) != AEC_OK)
        return status;
    r = lib->cu.cuInit(0);
    if (r != AECL_CUDA_SUCCESS) {
        *absent_status = aecl_driver_fail(lib, r, "aec_library_open: cuInit (is there an NVIDIA GPU?)");
        return AECL_ABSENT;
    }
    if ((r = lib->cu.cuCtxGetCurrent(&cur)) != AECL_CUDA_SUCCESS)
        return aecl_driver_fail(lib, r, "aec_library_open: cuCtxGetCurrent");
    if (cur != NULL) {
        lib->context = cur;
        if ((r = lib->cu.cuCtxGetDevice(&lib->device)) != AECL_CUDA_SUCCESS)
            return aecl_driver_fail(lib, r, "aec_library_open: cuCtxGetDevice");
    } else {
        if ((r = lib->cu.cuDeviceGet(&lib->device, 0)) != AECL_CUDA_SUCCESS)
            return aecl_driver_fail(lib, r, "aec_library_open: cuDeviceGet(0)");
        if ((r = lib->cu.cuDevicePrimaryCtxRetain(&lib->context, lib->device)) != AECL_CUDA_SUCCESS)
            return aecl_driver_fail(lib, r, "aec_library_open: cuDevicePrimaryCtxRetain(device 0)");
        lib->owns_primary_context = 1;
        if ((r = lib->cu.cuCtxSetCurrent(lib->context)) != AECL_CUDA_SUCCESS)
            return aecl_driver_fail(lib, r, "aec_library_open: cuCtxSetCurrent");
    }
    if ((r = lib->cu.cuDeviceGetAttribute(&lib->cc_major, AECL_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, lib->device)) != AECL_CUDA_SUCCESS ||
        (r = lib->cu.cuDeviceGetAttribute(&lib->cc_minor, AECL_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, lib->device)) != AECL_CUDA_SUCCESS ||
        (r = lib->cu.cuDeviceGetAttribute(&v, AECL_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, lib->device)) != AECL_CUDA_SUCCESS)
        return aecl_driver_fail(lib, r, "aec_library_open: cuDeviceGetAttribute");
    lib->sm_count = v;
    if ((r = lib->cu.cuDeviceGetAttribute(&v, AECL_CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, lib->device)) != AECL_CUDA_SUCCESS)
        return aecl_driver_fail(lib, r, "aec_library_open: cuDeviceGetAttribute(shared memory per multiprocessor)");
    lib->smem_per_sm = v;
    if (lib->cu.cuDeviceGetName(lib->device_name, (int)sizeof lib->device_name, lib->device) != AECL_CUDA_SUCCESS)
        snprintf(lib->device_name, sizeof lib->device_name, "CUDA device %d", lib->device);
    /* 9.0 runs the sm_90a builds; every 8.x the sm_80 ones. */
    if (lib->cc_major == 9 && lib->cc_minor == 0)
        snprintf(lib->arch, sizeof lib->arch, "sm_90a");
    else if (lib->cc_major == 8)
        snprintf(lib->arch, sizeof lib->arch, "sm_80");
    else
        snprintf(lib->arch, sizeof lib->arch, "sm_%d%d", lib->cc_major, lib->cc_minor);
    return AEC_OK;
}

/* Opens the HIP backend, as aecl_open_cuda. */
static inline int aecl_open_hip(aec_library *lib, int *absent_status)
{
    /* The unversioned name comes with ROCm's development files; runtime-only
       installs have the versioned ones. */
    static const char *const names[] = {
        "libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5",
        "/opt/rocm/lib/libamdhip64.so",
    };
    char first_why[256] = "";
    aecl_hipError r;
    int count = 0, v = 0, status;
    size_t i;
    lib->backend = AEC_BACKEND_HIP;
    for (i = 0; i < sizeof names / sizeof names[0] && lib->driver == NULL; i++) {
        lib->driver = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (lib->driver == NULL && i == 0) {
            const char *why = dlerror();
            snprintf(first_why, sizeof first_why, "%s", why != NULL ? why : "dlopen failed");
        }
    }
    if (lib->driver == NULL) {
        aecl_fail(lib->error, sizeof lib->error, AEC_ERROR_NO_DRIVER,
                  "aec_library_open: libamdhip64.so not found: ROCm's HIP runtime is not installed or "
                  "not on the library path (dlopen: %s); the library's HIP kernels need an AMD GPU and ROCm",
                  first_why);
        *absent_status = AEC_ERROR_NO_DRIVER;
        return AECL_ABSENT;
    }
    if ((status = aecl_load_hip_api(lib)) != AEC_OK)
        return status;
    r = lib->hip.hipInit(0);
    if (r != AECL_HIP_SUCCESS) {
        *absent_status = aecl_driver_fail(lib, r, "aec_library_open: hipInit (is there an AMD GPU?)");
        return AECL_ABSENT;
    }
    r = lib->hip.hipGetDeviceCount(&count);
    if (r != AECL_HIP_SUCCESS || count < 1) {
        *absent_status = r != AECL_HIP_SUCCESS
                             ? aecl_driver_fail(lib, r, "aec_library_open: hipGetDeviceCount (is there an AMD GPU?)")
                             : aecl_fail(lib->error, sizeof lib->error, AEC_ERROR_DRIVER,
                                         "aec_library_open: the HIP runtime sees no AMD GPU");
        return AECL_ABSENT;
    }
    if ((r = lib->hip.hipGetDevice(&lib->device)) != AECL_HIP_SUCCESS)
        return aecl_driver_fail(lib, r, "aec_library_open: hipGetDevice");
    if ((r = lib->hip.hipDeviceGetAttribute(&lib->cc_major, AECL_HIP_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, lib->device)) != AECL_HIP_SUCCESS ||
        (r = lib->hip.hipDeviceGetAttribute(&lib->cc_minor, AECL_HIP_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, lib->device)) != AECL_HIP_SUCCESS ||
        (r = lib->hip.hipDeviceGetAttribute(&v, AECL_HIP_ATTRIBUTE_MULTIPROCESSOR_COUNT, lib->device)) != AECL_HIP_SUCCESS)
        return aecl_driver_fail(lib, r, "aec_library_open: hipDeviceGetAttribute");
    lib->sm_count = v;
    if (lib->hip.hipDeviceGetName(lib->device_name, (int)sizeof lib->device_name, lib->device) != AECL_HIP_SUCCESS)
        snprintf(lib->device_name, sizeof lib->device_name, "HIP device %d", lib->device);
    /* HIP reports the gfx version as the compute capability: 9.0 is the
       MI200 series (gfx90a; also older gfx906/gfx908, whose code objects
       the library lacks: loading refuses them), 9.4 the MI300 series. */
    if (lib->cc_major == 9 && lib->cc_minor == 0)
        snprintf(lib->arch, sizeof lib->arch, "gfx90a");
    else if (lib->cc_major == 9 && lib->cc_minor == 4)
        snprintf(lib->arch, sizeof lib->arch, "gfx942");
    else
        snprintf(lib->arch, sizeof lib->arch, "gfx%d%d", lib->cc_major, lib->cc_minor);
    return AEC_OK;
}

/* Undoes a backend's partial open, keeping lib->dir and the message. */
static inline void aecl_open_undo(aec_library *lib)
{
    if (lib->backend == AEC_BACKEND_CUDA && lib->owns_primary_context)
        lib->cu.cuDevicePrimaryCtxRelease(lib->device);
    if (lib->driver != NULL)
        dlclose(lib->driver);
    lib->driver = NULL;
    lib->owns_primary_context = 0;
    lib->context = NULL;
    lib->backend = 0;
    memset(&lib->cu, 0, sizeof lib->cu);
    memset(&lib->hip, 0, sizeof lib->hip);
}

/* Opens the kernel library in directory `dir` (what `aec compile -o DIR`
   wrote) on `backend`: AEC_BACKEND_CUDA, AEC_BACKEND_HIP, or
   AEC_BACKEND_AUTO (those in AEC_LIBRARY_BACKENDS in turn, CUDA first,
   the first whose driver sees a GPU). Checks DIR/manifest.json is there and
   loads the driver; code objects are loaded on first use. On failure `lib`
   is left closed with the reason in aec_last_error(lib): AEC_ERROR_FILE (no
   library at `dir`), AEC_ERROR_NO_DRIVER (no driver could be loaded),
   AEC_ERROR_DRIVER (no GPU, or a driver call failed), AEC_ERROR_ARGUMENT
   (an unknown backend). */
static inline int aec_library_open_backend(aec_library *lib, const char *dir, int backend)
{
    char *manifest;
    FILE *f;
    int status = AEC_OK, absent = AEC_OK, tried = 0, loaded_any = 0, b;
    char tried_text[AEC_ERROR_CAPACITY] = "";
    if (lib == NULL)
        return AEC_ERROR_ARGUMENT;
    memset(lib, 0, sizeof *lib);
    if (dir == NULL)
        return aecl_fail(lib->error, sizeof lib->error, AEC_ERROR_ARGUMENT,
                         "aec_library_open: the directory is NULL");
    if (backend != AEC_BACKEND_AUTO && backend != AEC_BACKEND_CUDA && backend != AEC_BACKEND_HIP)
        return aecl_fail(lib->error, sizeof lib->error, AEC_ERROR_ARGUMENT,
                         "aec_library_open_backend: backend %d is none of AEC_BACKEND_AUTO, AEC_BACKEND_CUDA, "
                         "AEC_BACKEND_HIP",
                         backend);
    manifest = aecl_join(dir, "manifest.json");
    if (manifest == NULL)
        return aecl_fail(lib->error, sizeof lib->error, AEC_ERROR_MEMORY, "aec_library_open: out of memory");
    f = fopen(manifest, "rb");
    if (f == NULL) {
        status = aecl_fail(lib->error, sizeof lib->error, AEC_ERROR_FILE,
                           "aec_library_open: cannot read %s (%s): is %s a kernel library written by "
                           "`aec compile ... -o %s`?",
                           manifest, strerror(errno), dir, dir);
        free(manifest);
        return status;
    }
    fclose(f);
    free(manifest);
    lib->dir = aecl_strdup(dir);
    if (lib->dir == NULL)
        return aecl_fail(lib->error, sizeof lib->error, AEC_ERROR_MEMORY, "aec_library_open: out of memory");

    for (b = AEC_BACKEND_CUDA; b <= AEC_BACKEND_HIP; b++) {
        if (backend != AEC_BACKEND_AUTO ? backend != b : (AEC_LIBRARY_BACKENDS & b) == 0)
            continue;
        absent = AEC_OK;
        status = b == AEC_BACKEND_CUDA ? aecl_open_cuda(lib, &absent) : aecl_open_hip(lib, &absent);
        if (status == AEC_OK) {
            lib->is_open = 1;
            lib->error[0] = '\0';
            return AEC_OK;
        }
        if (status != AECL_ABSENT)
            break;
        /* This backend's driver is missing or sees no GPU: remember why and
           try the next. */
        loaded_any |= absent != AEC_ERROR_NO_DRIVER;
        if (tried++ > 0)
            aecl_append(tried_text, sizeof tried_text, "; ");
        aecl_append(tried_text, sizeof tried_text, lib->error);
        aecl_open_undo(lib);
    }
    if (status == AECL_ABSENT || tried == 0) {
        /* Every backend tried is absent (one message each, in order). */
        aec_library_close(lib);
        if (tried == 0)
            return aecl_fail(lib->error, sizeof lib->error, AEC_ERROR_NO_DRIVER,
                             "aec_library_open: the library has no builds for a backend to try");
        memcpy(lib->error, tried_text, sizeof lib->error);
        return loaded_any ? AEC_ERROR_DRIVER : AEC_ERROR_NO_DRIVER;
    }
    {
        char saved[AEC_ERROR_CAPACITY];
        memcpy(saved, lib->error, sizeof saved);
        aecl_open_undo(lib);
        aec_library_close(lib);
        memcpy(lib->error, saved, sizeof saved);
        return status;
    }
}

/* aec_library_open_backend(lib, dir, AEC_BACKEND_AUTO). */
static inline int aec_library_open(aec_library *lib, const char *dir)
{
    return aec_library_open_backend(lib, dir, AEC_BACKEND_AUTO);
}

/* ---- the calls' helpers ---- */

/* AEC_OK when the library is open and can run on the calling thread: CUDA,
   its context is current (made current when none is); HIP, its device is
   the current one. `fn` names the caller. */
static inline int aecl_enter(aec_library *lib, const char *fn)
{
    if (!lib->is_open)
        return aecl_fail(lib->error, sizeof lib->error, AEC_ERROR_ARGUMENT,
                         "%s: the aec_library is not open (aec_library_open failed or was not called)", fn);
    if (lib->backend == AEC_BACKEND_HIP) {
        int cur = -1;
        aecl_hipError r = lib->hip.hipGetDevice(&cur);
        if (r != AECL_HIP_SUCCESS)
            return aecl_driver_fail(lib, r, "hipGetDevice");
        if (cur != lib->device)
            return aecl_fail(lib->error, sizeof lib->error, AEC_ERROR_ARGUMENT,
                             "%s: the calling thread's current HIP device is %d, but the library was opened on "
                             "device %d; hipSetDevice(%d) first (or open another aec_library on device %d)",
                             fn, cur, lib->device, lib->device, cur);
    } else {
        aecl_CUcontext cur = NULL;
        aecl_CUresult r = lib->cu.cuCtxGetCurrent(&cur);
        if (r != AECL_CUDA_SUCCESS)
            return aecl_driver_fail(lib, r, "cuCtxGetCurrent");
        if (cur == NULL) {
            r = lib->cu.cuCtxSetCurrent(lib->context);
            if (r != AECL_CUDA_SUCCESS)
                return aecl_driver_fail(lib, r, "cuCtxSetCurrent");
        } else if (cur != lib->context) {
            return aecl_fail(lib->error, sizeof lib->error, AEC_ERROR_ARGUMENT,
                             "%s: the calling thread's current CUDA context is not the one the library was "
                             "opened in; make that one current (or open another aec_library in this one)",
                             fn);
        }
    }
    lib->error[0] = '\0';
    return AEC_OK;
}

/* The backend's calls, each returning the driver's result (0: success). */
static inline int aecl_call_module_load(aec_library *lib, aecl_module_handle *m, const void *image)
{
    return lib->backend == AEC_BACKEND_HIP ? lib->hip.hipModuleLoadData(m, image) : lib->cu.cuModuleLoadData(m, image);
}

static inline void aecl_call_module_unload(aec_library *lib, aecl_module_handle m)
{
    if (lib->backend == AEC_BACKEND_HIP)
        lib->hip.hipModuleUnload(m);
    else
        lib->cu.cuModuleUnload(m);
}

static inline int aecl_call_get_function(aec_library *lib, aecl_kernel *f, aecl_module_handle m, const char *entry)
{
    return lib->backend == AEC_BACKEND_HIP ? lib->hip.hipModuleGetFunction(f, m, entry)
                                           : lib->cu.cuModuleGetFunction(f, m, entry);
}

static inline int aecl_call_malloc(aec_library *lib, aecl_devptr *p, size_t bytes)
{
    if (lib->backend == AEC_BACKEND_HIP) {
        void *h = NULL;
        int r = lib->hip.hipMalloc(&h, bytes);
        *p = aecl_dptr(h);
        return r;
    }
    return lib->cu.cuMemAlloc(p, bytes);
}

static inline int aecl_call_free(aec_library *lib, aecl_devptr p)
{
    return lib->backend == AEC_BACKEND_HIP ? lib->hip.hipFree(aecl_hptr(p)) : lib->cu.cuMemFree(p);
}

static inline int aecl_call_stream_sync(aec_library *lib, void *stream)
{
    return lib->backend == AEC_BACKEND_HIP ? lib->hip.hipStreamSynchronize((aecl_hipStream)stream)
                                           : lib->cu.cuStreamSynchronize((aecl_CUstream)stream);
}

/* Reads a whole file into malloc'd memory. */
static inline int aecl_read_file(aec_library *lib, const char *path, void **data)
{
    FILE *f = fopen(path, "rb");
    long size;
    size_t got;
    char *buf;
    *data = NULL;
    if (f == NULL)
        return aecl_fail(lib->error, sizeof lib->error, AEC_ERROR_FILE, "cannot read the code object %s (%s)",
                         path, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return aecl_fail(lib->error, sizeof lib->error, AEC_ERROR_FILE, "cannot read the code object %s", path);
    }
    buf = (char *)malloc((size_t)size + 1);
    if (buf == NULL) {
        fclose(f);
        return aecl_fail(lib->error, sizeof lib->error, AEC_ERROR_MEMORY,
                         "out of memory reading %s (%ld bytes)", path, size);
    }
    got = fread(buf, 1, (size_t)size, f);
    fclose(f);
    if (got != (size_t)size || size == 0) {
        free(buf);
        return aecl_fail(lib->error, sizeof lib->error, AEC_ERROR_FILE,
                         "the code object %s is truncated or empty (%lu of %ld bytes read)", path,
                         (unsigned long)got, size);
    }
    buf[size] = '\0';
    *data = buf;
    return AEC_OK;
}

/* The function `entry` of the code object at `cubin` (a cubin or a HIP
   code object, relative to the library directory), loading the module on
   first use and, on CUDA, setting its dynamic shared memory limit to `smem`
   bytes when smem > 0 (HIP kernels use static LDS: their plans ask for none).
   Cached. */
static inline int aecl_function_get(aec_library *lib, const char *cubin, const char *entry, unsigned int smem,
                                    aecl_kernel *out)
{
    size_t m, i;
    int r;
    aecl_kernel fn = NULL;
    char what[512];
    *out = NULL;
    for (m = 0; m < lib->n_modules; m++)
        if (strcmp(lib->modules[m].path, cubin) == 0)
            break;
    if (m == lib->n_modules) {
        void *image = NULL;
        char *full = aecl_join(lib->dir, cubin);
        aecl_module *grown;
        aecl_module_handle module = NULL;
        int status;
        if (full == NULL)
            return aecl_fail(lib->error, sizeof lib->error, AEC_ERROR_MEMORY, "out of memory");
        status = aecl_read_file(lib, full, &image);
        if (status != AEC_OK) {
            free(full);
            return status;
        }
        r = aecl_call_module_load(lib, &module, image);
        free(image);
        if (r != 0) {
            snprintf(what, sizeof what, "%s(%s) on %s (%s)", AECL_CALL(lib, "cuModuleLoadData", "hipModuleLoadData"),
                     full, lib->device_name, lib->arch);
            free(full);
            return aecl_driver_fail(lib, r, what);
        }
        free(full);
        grown = (aecl_module *)realloc(lib->modules, (lib->n_modules + 1) * sizeof *grown);
        if (grown == NULL) {
            aecl_call_module_unload(lib, module);
            return aecl_fail(lib->error, sizeof lib->error, AEC_ERROR_MEMORY, "out of memory");
        }
        lib->modules = grown;
        lib->modules[m].path = aecl_strdup(cubin);
        lib->modules[m].module = module;
        if (lib->modules[m].path == NULL) {
            aecl_call_module_unload(lib, module);
            return aecl_fail(lib->error, sizeof lib->error, AEC_ERROR_MEMORY, "out of memory");
        }
        lib->n_modules++;
    }
    for (i = 0; i < lib->n_functions; i++)
        if (lib->functions[i].module == m && strcmp(lib->functions[i].entry, entry) == 0) {
            *out = lib->functions[i].function;
            return AEC_OK;
        }
    r = aecl_call_get_function(lib, &fn, lib->modules[m].module, entry);
    if (r != 0) {
        snprintf(what, sizeof what, "%s(%s) in %s", AECL_CALL(lib, "cuModuleGetFunction", "hipModuleGetFunction"),
                 entry, cubin);
        return aecl_driver_fail(lib, r, what);
    }
    if (smem > 0 && lib->backend == AEC_BACKEND_CUDA) {
        r = lib->cu.cuFuncSetAttribute(fn, AECL_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)smem);
        if (r != AECL_CUDA_SUCCESS) {
            snprintf(what, sizeof what,
                     "cuFuncSetAttribute(%s, MAX_DYNAMIC_SHARED_SIZE_BYTES = %u) on %s", entry, smem,
                     lib->device_name);
            return aecl_driver_fail(lib, r, what);
        }
    }
    {
        aecl_function *grown = (aecl_function *)realloc(lib->functions, (lib->n_functions + 1) * sizeof *grown);
        if (grown == NULL)
            return aecl_fail(lib->error, sizeof lib->error, AEC_ERROR_MEMORY, "out of memory");
        lib->functions = grown;
        lib->functions[lib->n_functions].module = m;
        lib->functions[lib->n_functions].entry = aecl_strdup(entry);
        lib->functions[lib->n_functions].function = fn;
        if (lib->functions[lib->n_functions].entry == NULL)
            return aecl_fail(lib->error, sizeof lib->error, AEC_ERROR_MEMORY, "out of memory");
        lib->n_functions++;
    }
    *out = fn;
    return AEC_OK;
}

/* Blocks of `fn` with `threads` threads and `smem` bytes of dynamic shared
   memory that one multiprocessor holds at once, by the CUDA driver's
   occupancy calculator (registers, threads and shared memory; `fn` comes
   from aecl_function_get, which opted it in to `smem`). 0 where it cannot
   say, and on HIP: the KV-split rule then uses its shared-memory bound. */
static inline int aecl_resident_blocks(const aec_library *lib, aecl_kernel fn, unsigned int threads, unsigned int smem)
{
    int n = 0;
    if (lib->backend != AEC_BACKEND_CUDA || fn == NULL)
        return 0;
    if (lib->cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(&n, fn, (int)threads, (size_t)smem) != AECL_CUDA_SUCCESS)
        return 0;
    return n;
}

/* Launches `fn` with blockDim (threads, 1, 1). */
static inline int aecl_launch(aec_library *lib, aecl_kernel fn, const uint64_t grid[3], unsigned int threads,
                              unsigned int smem, void *stream, void **args, const char *caller, const char *entry)
{
    unsigned int gx = (unsigned int)grid[0], gy = (unsigned int)grid[1], gz = (unsigned int)grid[2];
    int r = lib->backend == AEC_BACKEND_HIP
                ? lib->hip.hipModuleLaunchKernel(fn, gx, gy, gz, threads, 1, 1, smem, (aecl_hipStream)stream, args, NULL)
                : lib->cu.cuLaunchKernel(fn, gx, gy, gz, threads, 1, 1, smem, (aecl_CUstream)stream, args, NULL);
    if (r != 0) {
        char what[512];
        snprintf(what, sizeof what, "%s: %s(%s, grid (%llu, %llu, %llu), %u threads, %u bytes of shared memory)",
                 caller, AECL_CALL(lib, "cuLaunchKernel", "hipModuleLaunchKernel"), entry,
                 (unsigned long long)grid[0], (unsigned long long)grid[1],
                 (unsigned long long)grid[2], threads, smem);
        return aecl_driver_fail(lib, r, what);
    }
    return AEC_OK;
}

static inline const char *aecl_tensor_map_type_name(int data_type)
{
    switch (data_type) {
    case AECL_CU_TENSOR_MAP_DATA_TYPE_BFLOAT16: return "bf16";
    case AECL_CU_TENSOR_MAP_DATA_TYPE_FLOAT16: return "f16";
    case AECL_CU_TENSOR_MAP_DATA_TYPE_FLOAT32: return "f32";
    default: return "an unknown element type";
    }
}

/* Encodes into `map` (AECL_TENSOR_MAP_BYTES at an AECL_TENSOR_MAP_ALIGN
   boundary) the tensor map of `tensor` at `address`, as the launch plan's
   TensorMapPlan says: rank 3, elements `data_type` of `bytes` bytes,
   extents `dims` innermost first (checked by aecl_check_tensor_map),
   contiguous (byte strides dims[0] * bytes, dims[0] * dims[1] * bytes),
   boxes `box`, element strides 1, no interleave, the 128-byte swizzle, L2
   promotion by 128 bytes, zeros outside the extents. The kernel then takes
   `map` itself as the argument (cuLaunchKernel copies the 128 bytes). */
static inline int aecl_tensor_map_encode(aec_library *lib, unsigned char *map, int data_type, uint64_t bytes,
                                         aecl_devptr address, const uint64_t dims[3], const uint32_t box[3],
                                         const char *caller, const char *entry, const char *tensor)
{
    static const uint32_t element_strides[3] = {1u, 1u, 1u};
    uint64_t strides[2];
    aecl_CUresult r;
    char what[512];
    if (lib->backend != AEC_BACKEND_CUDA)
        return aecl_fail(lib->error, sizeof lib->error, AEC_ERROR_NO_KERNEL,
                         "%s: kernel %s takes a CUDA tensor map of %s, which the HIP runtime has no equivalent "
                         "of; HIP builds of aec never take one: the library's manifest is inconsistent",
                         caller, entry, tensor);
    if (lib->cu.cuTensorMapEncodeTiled == NULL)
        return aecl_fail(lib->error, sizeof lib->error, AEC_ERROR_DRIVER,
                         "%s: kernel %s takes a tensor map of %s, but libcuda.so.1 lacks cuTensorMapEncodeTiled: "
                         "the NVIDIA driver is too old (CUDA 12 or newer is needed)",
                         caller, entry, tensor);
    if (address % AEC_TENSOR_ALIGN != 0)
        return aecl_fail(lib->error, sizeof lib->error, AEC_ERROR_ARGUMENT,
                         "%s: the tensor %s at %p is not 16-byte aligned, as the tensor map kernel %s reads it "
                         "through must be (a pointer into the middle of an allocation?)",
                         caller, tensor, aecl_hptr(address), entry);
    if ((uintptr_t)map % AECL_TENSOR_MAP_ALIGN != 0)
        return aecl_fail(lib->error, sizeof lib->error, AEC_ERROR_ARGUMENT,
                         "%s: the tensor map of %s is not stored %u-byte aligned", caller, tensor,
                         AECL_TENSOR_MAP_ALIGN);
    strides[0] = dims[0] * bytes;
    strides[1] = dims[0] * dims[1] * bytes;
    r = lib->cu.cuTensorMapEncodeTiled(map, data_type, 3u, aecl_hptr(address), dims, strides, box, element_strides,
                                       AECL_CU_TENSOR_MAP_INTERLEAVE_NONE, AECL_CU_TENSOR_MAP_SWIZZLE_128B,
                                       AECL_CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                                       AECL_CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != AECL_CUDA_SUCCESS) {
        snprintf(what, sizeof what,
                 "%s: cuTensorMapEncodeTiled of %s for kernel %s (%s at %p, extents (%llu, %llu, %llu) innermost "
                 "first, box (%u, %u, %u), 128-byte swizzle)",
                 caller, tensor, entry, aecl_tensor_map_type_name(data_type), aecl_hptr(address),
                 (unsigned long long)dims[0], (unsigned long long)dims[1], (unsigned long long)dims[2],
                 (unsigned)box[0], (unsigned)box[1], (unsigned)box[2]);
        return aecl_driver_fail(lib, r, what);
    }
    return AEC_OK;
}

/* Fills `bytes` bytes at `p` with zeros on `stream` (p == 0: nothing). */
static inline int aecl_zero(aec_library *lib, aecl_devptr p, uint64_t bytes, void *stream, const char *caller,
                            const char *buffer)
{
    int r;
    char what[256];
    if (p == 0 || bytes == 0)
        return AEC_OK;
    if (lib->backend == AEC_BACKEND_HIP)
        r = bytes % 4 == 0
                ? lib->hip.hipMemsetD32Async(aecl_hptr(p), 0, (size_t)(bytes / 4), (aecl_hipStream)stream)
                : lib->hip.hipMemsetD16Async(aecl_hptr(p), 0u, (size_t)(bytes / 2), (aecl_hipStream)stream);
    else
        r = bytes % 4 == 0 ? lib->cu.cuMemsetD32Async(p, 0u, (size_t)(bytes / 4), (aecl_CUstream)stream)
                           : lib->cu.cuMemsetD16Async(p, 0u, (size_t)(bytes / 2), (aecl_CUstream)stream);
    if (r != 0) {
        snprintf(what, sizeof what, "%s: zero-filling %s (%llu bytes)", caller, buffer, (unsigned long long)bytes);
        return aecl_driver_fail(lib, r, what);
    }
    return AEC_OK;
}

/* Allocates a call's workspace when the caller gave none. */
static inline int aecl_workspace_alloc(aec_library *lib, uint64_t bytes, aecl_devptr *p, const char *caller)
{
    int r;
    char what[256];
    if ((uint64_t)(size_t)bytes != bytes)
        return aecl_fail(lib->error, sizeof lib->error, AEC_ERROR_SHAPE,
                         "%s: the workspace would be %llu bytes, more than size_t holds", caller,
                         (unsigned long long)bytes);
    r = aecl_call_malloc(lib, p, (size_t)bytes);
    if (r != 0) {
        snprintf(what, sizeof what, "%s: %s of the workspace (%llu bytes)", caller,
                 AECL_CALL(lib, "cuMemAlloc", "hipMalloc"), (unsigned long long)bytes);
        return aecl_driver_fail(lib, r, what);
    }
    return AEC_OK;
}

/* Waits for `stream` and frees a workspace the call allocated; returns
   `status` when it is already an error, else the result of the two. */
static inline int aecl_workspace_release(aec_library *lib, aecl_devptr p, void *stream, int status,
                                         const char *caller)
{
    char what[256];
    int r = aecl_call_stream_sync(lib, stream);
    int f = aecl_call_free(lib, p);
    if (status != AEC_OK)
        return status;
    if (r != 0) {
        snprintf(what, sizeof what, "%s: %s before freeing the workspace", caller,
                 AECL_CALL(lib, "cuStreamSynchronize", "hipStreamSynchronize"));
        return aecl_driver_fail(lib, r, what);
    }
    if (f != 0) {
        snprintf(what, sizeof what, "%s: %s of the workspace", caller, AECL_CALL(lib, "cuMemFree", "hipFree"));
        return aecl_driver_fail(lib, f, what);
    }
    return AEC_OK;
}

/* ---- device memory, for programs that use nothing but this library ---- */

/* Allocates `bytes` of device memory (cuMemAlloc / hipMalloc: 256-byte
   aligned or more). */
static inline int aec_device_alloc(aec_library *lib, size_t bytes, void **ptr)
{
    aecl_devptr p = 0;
    int r, status;
    if (lib == NULL || ptr == NULL)
        return lib == NULL ? AEC_ERROR_ARGUMENT
                           : aecl_fail(lib->error, sizeof lib->error, AEC_ERROR_ARGUMENT, "aec_device_alloc: ptr is NULL");
    *ptr = NULL;
    if ((status = aecl_enter(lib, "aec_device_alloc")) != AEC_OK)
        return status;
    r = aecl_call_malloc(lib, &p, bytes);
    if (r != 0) {
        char what[128];
        snprintf(what, sizeof what, "aec_device_alloc: %s(%lu bytes)", AECL_CALL(lib, "cuMemAlloc", "hipMalloc"),
                 (unsigned long)bytes);
        return aecl_driver_fail(lib, r, what);
    }
    *ptr = aecl_hptr(p);
    return AEC_OK;
}

/* Frees memory from aec_device_alloc (NULL: nothing). */
static inline int aec_device_free(aec_library *lib, void *ptr)
{
    int r, status;
    if (lib == NULL)
        return AEC_ERROR_ARGUMENT;
    if (ptr == NULL)
        return AEC_OK;
    if ((status = aecl_enter(lib, "aec_device_free")) != AEC_OK)
        return status;
    r = aecl_call_free(lib, aecl_dptr(ptr));
    return r == 0 ? AEC_OK : aecl_driver_fail(lib, r, AECL_CALL(lib, "aec_device_free: cuMemFree", "aec_device_free: hipFree"));
}

/* Copies `bytes` from host memory to device memory (synchronous). */
static inline int aec_copy_to_device(aec_library *lib, void *device_dst, const void *host_src, size_t bytes)
{
    int r, status;
    if (lib == NULL)
        return AEC_ERROR_ARGUMENT;
    if ((device_dst == NULL || host_src == NULL) && bytes > 0)
        return aecl_fail(lib->error, sizeof lib->error, AEC_ERROR_ARGUMENT,
                         "aec_copy_to_device: a NULL pointer with %lu bytes to copy", (unsigned long)bytes);
    if ((status = aecl_enter(lib, "aec_copy_to_device")) != AEC_OK)
        return status;
    if (bytes == 0)
        return AEC_OK;
    r = lib->backend == AEC_BACKEND_HIP ? lib->hip.hipMemcpyHtoD(device_dst, (void *)(uintptr_t)host_src, bytes)
                                        : lib->cu.cuMemcpyHtoD(aecl_dptr(device_dst), host_src, bytes);
    return r == 0 ? AEC_OK
                  : aecl_driver_fail(lib, r, AECL_CALL(lib, "aec_copy_to_device: cuMemcpyHtoD", "aec_copy_to_device: hipMemcpyHtoD"));
}

/* Copies `bytes` from device memory to host memory (synchronous). */
static inline int aec_copy_to_host(aec_library *lib, void *host_dst, const void *device_src, size_t bytes)
{
    int r, status;
    if (lib == NULL)
        return AEC_ERROR_ARGUMENT;
    if ((host_dst == NULL || device_src == NULL) && bytes > 0)
        return aecl_fail(lib->error, sizeof lib->error, AEC_ERROR_ARGUMENT,
                         "aec_copy_to_host: a NULL pointer with %lu bytes to copy", (unsigned long)bytes);
    if ((status = aecl_enter(lib, "aec_copy_to_host")) != AEC_OK)
        return status;
    if (bytes == 0)
        return AEC_OK;
    r = lib->backend == AEC_BACKEND_HIP ? lib->hip.hipMemcpyDtoH(host_dst, (void *)(uintptr_t)device_src, bytes)
                                        : lib->cu.cuMemcpyDtoH(host_dst, aecl_dptr(device_src), bytes);
    return r == 0 ? AEC_OK
                  : aecl_driver_fail(lib, r, AECL_CALL(lib, "aec_copy_to_host: cuMemcpyDtoH", "aec_copy_to_host: hipMemcpyDtoH"));
}

/* Waits for all work on the library's context (CUDA) or device (HIP);
   kernel faults surface here. */
static inline int aec_synchronize(aec_library *lib)
{
    int r, status;
    if (lib == NULL)
        return AEC_ERROR_ARGUMENT;
    if ((status = aecl_enter(lib, "aec_synchronize")) != AEC_OK)
        return status;
    r = lib->backend == AEC_BACKEND_HIP ? lib->hip.hipDeviceSynchronize() : lib->cu.cuCtxSynchronize();
    return r == 0 ? AEC_OK
                  : aecl_driver_fail(lib, r, AECL_CALL(lib, "aec_synchronize: cuCtxSynchronize", "aec_synchronize: hipDeviceSynchronize"));
}

/* Waits for the work on `stream` (a CUstream or hipStream_t; NULL: the
   default stream). */
static inline int aec_stream_synchronize(aec_library *lib, void *stream)
{
    int r, status;
    if (lib == NULL)
        return AEC_ERROR_ARGUMENT;
    if ((status = aecl_enter(lib, "aec_stream_synchronize")) != AEC_OK)
        return status;
    r = aecl_call_stream_sync(lib, stream);
    return r == 0 ? AEC_OK
                  : aecl_driver_fail(lib, r, AECL_CALL(lib, "aec_stream_synchronize: cuStreamSynchronize",
                                                       "aec_stream_synchronize: hipStreamSynchronize"));
}

#ifdef __cplusplus
}
#endif

#endif /* AEC_LOADER_H */
