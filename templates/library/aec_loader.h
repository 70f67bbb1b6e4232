/*
 * aec_loader.h: the runtime of aec kernel libraries (written by `aec compile`
 * as DIR/include/aec_loader.h next to the generated DIR/include/aec_library.h).
 *
 * Header-only, C99 and C++ (every function is `static inline`). It needs no
 * CUDA toolkit headers: it declares the few driver types it uses and loads
 * the CUDA driver (libcuda.so.1) with dlopen at run time, so a program built
 * against it links only libdl (`-ldl`; part of libc on glibc 2.34+) and runs
 * wherever the NVIDIA driver is installed. Without a driver every call
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
 * aec_library_open uses the CUDA context current on the calling thread, or
 * retains device 0's primary context (the one the CUDA runtime and PyTorch
 * use) and makes it current. Later calls run in that context: on a thread
 * with no current context they make it current; on a thread with another
 * context current they refuse (AEC_ERROR_ARGUMENT). An aec_library caches the
 * modules and functions it loads: use one aec_library per thread, or
 * serialise calls on a shared one.
 *
 * Device pointers are passed as `void*` (a CUdeviceptr cast to a pointer),
 * streams as `void*` (a CUstream; NULL is the legacy default stream).
 */
#ifndef AEC_LOADER_H
#define AEC_LOADER_H

#define AEC_LOADER_VERSION 1

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
       library that is not open, another CUDA context current. */
    AEC_ERROR_ARGUMENT = 1,
    /* Sizes that break the plan: below 1, a fixed size with another value,
       a broken multiple-of/equal rule, head dims the library lacks, a grid
       over the launch limits. */
    AEC_ERROR_SHAPE = 2,
    /* No kernel for this GPU's architecture in the library. */
    AEC_ERROR_NO_KERNEL = 3,
    /* libcuda.so.1 (the NVIDIA driver) could not be loaded. */
    AEC_ERROR_NO_DRIVER = 4,
    /* A CUDA driver call failed (the message names it and the error). */
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
   given to a call must be aligned to it (cuMemAlloc's are). */
#define AEC_WORKSPACE_ALIGN 256u

/* Every tensor given to a call must start at a multiple of this many bytes:
   the kernels load and store 16 bytes per lane (cp.async, vector stores).
   cuMemAlloc's allocations are; a pointer into the middle of one may not be. */
#define AEC_TENSOR_ALIGN 16u

/* The CUDA driver types the loader uses (same layout as cuda.h). */
typedef int aecl_CUresult;
typedef int aecl_CUdevice;
typedef unsigned long long aecl_CUdeviceptr;
typedef struct aecl_CUctx_st *aecl_CUcontext;
typedef struct aecl_CUmod_st *aecl_CUmodule;
typedef struct aecl_CUfunc_st *aecl_CUfunction;
typedef struct aecl_CUstream_st *aecl_CUstream;

#define AECL_CUDA_SUCCESS 0
#define AECL_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT 16
#define AECL_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR 75
#define AECL_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR 76
#define AECL_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES 8

/* The driver entry points, loaded with dlsym (the `_v2` symbols where the
   driver exports them). */
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
    aecl_CUresult (*cuModuleLoadData)(aecl_CUmodule *, const void *);
    aecl_CUresult (*cuModuleUnload)(aecl_CUmodule);
    aecl_CUresult (*cuModuleGetFunction)(aecl_CUfunction *, aecl_CUmodule, const char *);
    aecl_CUresult (*cuFuncSetAttribute)(aecl_CUfunction, int, int);
    aecl_CUresult (*cuLaunchKernel)(aecl_CUfunction, unsigned int, unsigned int, unsigned int,
                                    unsigned int, unsigned int, unsigned int, unsigned int,
                                    aecl_CUstream, void **, void **);
    aecl_CUresult (*cuMemsetD32Async)(aecl_CUdeviceptr, unsigned int, size_t, aecl_CUstream);
    aecl_CUresult (*cuMemsetD16Async)(aecl_CUdeviceptr, unsigned short, size_t, aecl_CUstream);
    aecl_CUresult (*cuMemAlloc)(aecl_CUdeviceptr *, size_t);
    aecl_CUresult (*cuMemFree)(aecl_CUdeviceptr);
    aecl_CUresult (*cuMemcpyHtoD)(aecl_CUdeviceptr, const void *, size_t);
    aecl_CUresult (*cuMemcpyDtoH)(void *, aecl_CUdeviceptr, size_t);
    aecl_CUresult (*cuStreamSynchronize)(aecl_CUstream);
} aecl_cuda_api;

/* A loaded code object (one per cubin path). */
typedef struct aecl_module {
    char *path;
    aecl_CUmodule module;
} aecl_module;

/* A kernel function fetched from a module, its shared-memory limit set. */
typedef struct aecl_function {
    size_t module;
    char *entry;
    aecl_CUfunction function;
} aecl_function;

#define AEC_ERROR_CAPACITY 1024

/* An open kernel library. Open it with aec_library_open, close it with
   aec_library_close; read the fields, never write them. */
typedef struct aec_library {
    int is_open;
    void *driver;                 /* dlopen handle of libcuda.so.1 */
    aecl_cuda_api cu;             /* its entry points */
    aecl_CUcontext context;       /* the context calls run in */
    aecl_CUdevice device;         /* its device */
    int owns_primary_context;     /* 1: retained by aec_library_open */
    char device_name[128];        /* e.g. "NVIDIA H100 80GB HBM3" */
    int cc_major, cc_minor;       /* compute capability, e.g. 9 and 0 */
    char arch[16];                /* the builds this GPU runs: "sm_90a" (9.0), "sm_80" (8.x), "sm_XY" */
    int sm_count;                 /* multiprocessors (the KV-split rule and persistent grids read it) */
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

/* AEC_ERROR_DRIVER with "<what> failed: CUDA_ERROR_X (its description)". */
static inline int aecl_driver_fail(aec_library *lib, aecl_CUresult r, const char *what)
{
    const char *name = NULL, *text = NULL;
    if (lib->cu.cuGetErrorName == NULL || lib->cu.cuGetErrorName(r, &name) != AECL_CUDA_SUCCESS)
        name = NULL;
    if (lib->cu.cuGetErrorString == NULL || lib->cu.cuGetErrorString(r, &text) != AECL_CUDA_SUCCESS)
        text = NULL;
    if (name != NULL)
        return aecl_fail(lib->error, sizeof lib->error, AEC_ERROR_DRIVER, "%s failed: %s (%s)", what,
                         name, text != NULL ? text : "no description");
    return aecl_fail(lib->error, sizeof lib->error, AEC_ERROR_DRIVER, "%s failed: CUDA error %d",
                     what, (int)r);
}

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

static inline uint64_t aecl_align(uint64_t bytes, int *overflow)
{
    return aecl_mul(aecl_ceil_div(bytes, AEC_WORKSPACE_ALIGN, overflow), AEC_WORKSPACE_ALIGN, overflow);
}

static inline uint64_t aecl_clamp(uint64_t x, uint64_t lo, uint64_t hi)
{
    return x < lo ? lo : x > hi ? hi : x;
}

/* The KV-split rule of the launch plans (KvSplitPlan::splits): 1 when the
   grid already has 2 blocks per multiprocessor; otherwise
   clamp(ceil(2 * SMs / blocks), 1, clamp(key_blocks / 4, 1, max_splits)). */
static inline uint64_t aecl_kv_splits(uint64_t blocks, uint64_t key_blocks, uint64_t max_splits, int sm_count)
{
    uint64_t sms = sm_count < 1 ? 1u : (uint64_t)sm_count;
    uint64_t most;
    if (blocks == 0 || blocks >= 2 * sms)
        return 1;
    most = aecl_clamp(key_blocks / 4, 1, max_splits < 1 ? 1 : max_splits);
    return aecl_clamp((2 * sms + blocks - 1) / blocks, 1, most);
}

/* AEC_ERROR_SHAPE unless 1 <= x < 2^31 and 1 <= y, z < 65536. */
static inline int aecl_check_grid(char *err, size_t n, const char *fn, const char *entry, const uint64_t g[3])
{
    if (g[0] < 1 || g[0] > 2147483647u || g[1] < 1 || g[1] > 65535u || g[2] < 1 || g[2] > 65535u)
        return aecl_fail(err, n, AEC_ERROR_SHAPE,
                         "%s: the grid of kernel %s would be (%llu, %llu, %llu); CUDA allows x in "
                         "[1, 2^31 - 1] and y, z in [1, 65535]: use smaller sizes",
                         fn, entry, (unsigned long long)g[0], (unsigned long long)g[1],
                         (unsigned long long)g[2]);
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

static inline aecl_CUdeviceptr aecl_dptr(const void *p)
{
    return (aecl_CUdeviceptr)(uintptr_t)p;
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

/* Closes `lib`: unloads its modules, releases the primary context it
   retained, unloads the driver. Safe on a library whose open failed and on
   a closed one. */
static inline void aec_library_close(aec_library *lib)
{
    size_t i;
    if (lib == NULL)
        return;
    if (lib->is_open) {
        aecl_CUcontext cur = NULL;
        if (lib->cu.cuCtxGetCurrent(&cur) == AECL_CUDA_SUCCESS && cur == NULL)
            lib->cu.cuCtxSetCurrent(lib->context);
        for (i = 0; i < lib->n_modules; i++)
            lib->cu.cuModuleUnload(lib->modules[i].module);
        if (lib->owns_primary_context)
            lib->cu.cuDevicePrimaryCtxRelease(lib->device);
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

/* Loads every driver entry point; AEC_ERROR_DRIVER naming a missing one. */
static inline int aecl_load_driver_api(aec_library *lib)
{
    static const char *const names[] = {
        "cuInit", "cuGetErrorName", "cuGetErrorString", "cuDeviceGet", "cuDeviceGetAttribute",
        "cuDeviceGetName", "cuCtxGetCurrent", "cuCtxSetCurrent", "cuCtxGetDevice",
        "cuCtxSynchronize", "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRelease_v2",
        "cuModuleLoadData", "cuModuleUnload", "cuModuleGetFunction", "cuFuncSetAttribute",
        "cuLaunchKernel", "cuMemsetD32Async", "cuMemsetD16Async", "cuMemAlloc_v2", "cuMemFree_v2",
        "cuMemcpyHtoD_v2", "cuMemcpyDtoH_v2", "cuStreamSynchronize",
    };
    aecl_cuda_api *c = &lib->cu;
    /* The slots in the order of `names`. */
    void *slots[sizeof names / sizeof names[0]];
    size_t i, n = sizeof names / sizeof names[0];
    for (i = 0; i < n; i++) {
        slots[i] = dlsym(lib->driver, names[i]);
        if (slots[i] == NULL)
            return aecl_fail(lib->error, sizeof lib->error, AEC_ERROR_DRIVER,
                             "aec_library_open: libcuda.so.1 lacks %s: the NVIDIA driver is too old "
                             "(CUDA 12 or newer is needed)",
                             names[i]);
    }
    /* dlsym gives object pointers; copy their bits into the function
       pointers (POSIX guarantees they have the same representation). */
#define AECL_SET(field, idx) memcpy(&c->field, &slots[idx], sizeof c->field)
    AECL_SET(cuInit, 0);
    AECL_SET(cuGetErrorName, 1);
    AECL_SET(cuGetErrorString, 2);
    AECL_SET(cuDeviceGet, 3);
    AECL_SET(cuDeviceGetAttribute, 4);
    AECL_SET(cuDeviceGetName, 5);
    AECL_SET(cuCtxGetCurrent, 6);
    AECL_SET(cuCtxSetCurrent, 7);
    AECL_SET(cuCtxGetDevice, 8);
    AECL_SET(cuCtxSynchronize, 9);
    AECL_SET(cuDevicePrimaryCtxRetain, 10);
    AECL_SET(cuDevicePrimaryCtxRelease, 11);
    AECL_SET(cuModuleLoadData, 12);
    AECL_SET(cuModuleUnload, 13);
    AECL_SET(cuModuleGetFunction, 14);
    AECL_SET(cuFuncSetAttribute, 15);
    AECL_SET(cuLaunchKernel, 16);
    AECL_SET(cuMemsetD32Async, 17);
    AECL_SET(cuMemsetD16Async, 18);
    AECL_SET(cuMemAlloc, 19);
    AECL_SET(cuMemFree, 20);
    AECL_SET(cuMemcpyHtoD, 21);
    AECL_SET(cuMemcpyDtoH, 22);
    AECL_SET(cuStreamSynchronize, 23);
#undef AECL_SET
    return AEC_OK;
}

/* Opens the kernel library in directory `dir` (what `aec compile -o DIR`
   wrote): checks DIR/manifest.json is there, loads the CUDA driver, and
   takes the calling thread's current context or retains device 0's primary
   context. Code objects are loaded on first use. On failure `lib` is left
   closed with the reason in aec_last_error(lib): AEC_ERROR_FILE (no
   library at `dir`), AEC_ERROR_NO_DRIVER (no libcuda.so.1),
   AEC_ERROR_DRIVER (no device, or a driver call failed). */
static inline int aec_library_open(aec_library *lib, const char *dir)
{
    char *manifest;
    FILE *f;
    aecl_CUresult r;
    aecl_CUcontext cur = NULL;
    int v = 0, status;
    if (lib == NULL)
        return AEC_ERROR_ARGUMENT;
    memset(lib, 0, sizeof *lib);
    if (dir == NULL)
        return aecl_fail(lib->error, sizeof lib->error, AEC_ERROR_ARGUMENT,
                         "aec_library_open: the directory is NULL");
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

    lib->driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib->driver == NULL) {
        const char *why = dlerror();
        char detail[512];
        snprintf(detail, sizeof detail, "%s", why != NULL ? why : "dlopen failed");
        aec_library_close(lib);
        return aecl_fail(lib->error, sizeof lib->error, AEC_ERROR_NO_DRIVER,
                         "aec_library_open: libcuda.so.1 not found: the NVIDIA driver is not installed "
                         "or not on the library path (dlopen: %s); aec kernels need an NVIDIA GPU and "
                         "its driver",
                         detail);
    }
    status = aecl_load_driver_api(lib);
    if (status != AEC_OK)
        goto fail;
    r = lib->cu.cuInit(0);
    if (r != AECL_CUDA_SUCCESS) {
        status = aecl_driver_fail(lib, r, "aec_library_open: cuInit (is there an NVIDIA GPU?)");
        goto fail;
    }
    r = lib->cu.cuCtxGetCurrent(&cur);
    if (r != AECL_CUDA_SUCCESS) {
        status = aecl_driver_fail(lib, r, "aec_library_open: cuCtxGetCurrent");
        goto fail;
    }
    if (cur != NULL) {
        lib->context = cur;
        r = lib->cu.cuCtxGetDevice(&lib->device);
        if (r != AECL_CUDA_SUCCESS) {
            status = aecl_driver_fail(lib, r, "aec_library_open: cuCtxGetDevice");
            goto fail;
        }
    } else {
        r = lib->cu.cuDeviceGet(&lib->device, 0);
        if (r != AECL_CUDA_SUCCESS) {
            status = aecl_driver_fail(lib, r, "aec_library_open: cuDeviceGet(0)");
            goto fail;
        }
        r = lib->cu.cuDevicePrimaryCtxRetain(&lib->context, lib->device);
        if (r != AECL_CUDA_SUCCESS) {
            status = aecl_driver_fail(lib, r, "aec_library_open: cuDevicePrimaryCtxRetain(device 0)");
            goto fail;
        }
        lib->owns_primary_context = 1;
        r = lib->cu.cuCtxSetCurrent(lib->context);
        if (r != AECL_CUDA_SUCCESS) {
            status = aecl_driver_fail(lib, r, "aec_library_open: cuCtxSetCurrent");
            goto fail;
        }
    }
    if ((r = lib->cu.cuDeviceGetAttribute(&lib->cc_major, AECL_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, lib->device)) != AECL_CUDA_SUCCESS ||
        (r = lib->cu.cuDeviceGetAttribute(&lib->cc_minor, AECL_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, lib->device)) != AECL_CUDA_SUCCESS ||
        (r = lib->cu.cuDeviceGetAttribute(&v, AECL_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, lib->device)) != AECL_CUDA_SUCCESS) {
        status = aecl_driver_fail(lib, r, "aec_library_open: cuDeviceGetAttribute");
        goto fail;
    }
    lib->sm_count = v;
    if (lib->cu.cuDeviceGetName(lib->device_name, (int)sizeof lib->device_name, lib->device) != AECL_CUDA_SUCCESS)
        snprintf(lib->device_name, sizeof lib->device_name, "CUDA device %d", (int)lib->device);
    /* 9.0 runs the sm_90a builds; every 8.x the sm_80 ones. */
    if (lib->cc_major == 9 && lib->cc_minor == 0)
        snprintf(lib->arch, sizeof lib->arch, "sm_90a");
    else if (lib->cc_major == 8)
        snprintf(lib->arch, sizeof lib->arch, "sm_80");
    else
        snprintf(lib->arch, sizeof lib->arch, "sm_%d%d", lib->cc_major, lib->cc_minor);
    lib->is_open = 1;
    lib->error[0] = '\0';
    return AEC_OK;
fail:
    {
        char saved[AEC_ERROR_CAPACITY];
        memcpy(saved, lib->error, sizeof saved);
        if (lib->owns_primary_context)
            lib->cu.cuDevicePrimaryCtxRelease(lib->device);
        lib->owns_primary_context = 0;
        aec_library_close(lib);
        memcpy(lib->error, saved, sizeof saved);
        return status;
    }
}

/* ---- the calls' helpers ---- */

/* AEC_OK when the library is open and its context is current on the
   calling thread (made current when none is). `fn` names the caller. */
static inline int aecl_enter(aec_library *lib, const char *fn)
{
    aecl_CUcontext cur = NULL;
    aecl_CUresult r;
    if (!lib->is_open)
        return aecl_fail(lib->error, sizeof lib->error, AEC_ERROR_ARGUMENT,
                         "%s: the aec_library is not open (aec_library_open failed or was not called)", fn);
    r = lib->cu.cuCtxGetCurrent(&cur);
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
    lib->error[0] = '\0';
    return AEC_OK;
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

/* The function `entry` of the cubin at `cubin` (relative to the library
   directory), loading the module on first use and setting its dynamic
   shared memory limit to `smem` bytes when smem > 0. Cached. */
static inline int aecl_function_get(aec_library *lib, const char *cubin, const char *entry, unsigned int smem,
                                    aecl_CUfunction *out)
{
    size_t m, i;
    aecl_CUresult r;
    aecl_CUfunction fn = NULL;
    char what[512];
    *out = NULL;
    for (m = 0; m < lib->n_modules; m++)
        if (strcmp(lib->modules[m].path, cubin) == 0)
            break;
    if (m == lib->n_modules) {
        void *image = NULL;
        char *full = aecl_join(lib->dir, cubin);
        aecl_module *grown;
        aecl_CUmodule module = NULL;
        int status;
        if (full == NULL)
            return aecl_fail(lib->error, sizeof lib->error, AEC_ERROR_MEMORY, "out of memory");
        status = aecl_read_file(lib, full, &image);
        if (status != AEC_OK) {
            free(full);
            return status;
        }
        r = lib->cu.cuModuleLoadData(&module, image);
        free(image);
        if (r != AECL_CUDA_SUCCESS) {
            snprintf(what, sizeof what, "cuModuleLoadData(%s) on %s (%s)", full, lib->device_name, lib->arch);
            free(full);
            return aecl_driver_fail(lib, r, what);
        }
        free(full);
        grown = (aecl_module *)realloc(lib->modules, (lib->n_modules + 1) * sizeof *grown);
        if (grown == NULL) {
            lib->cu.cuModuleUnload(module);
            return aecl_fail(lib->error, sizeof lib->error, AEC_ERROR_MEMORY, "out of memory");
        }
        lib->modules = grown;
        lib->modules[m].path = aecl_strdup(cubin);
        lib->modules[m].module = module;
        if (lib->modules[m].path == NULL) {
            lib->cu.cuModuleUnload(module);
            return aecl_fail(lib->error, sizeof lib->error, AEC_ERROR_MEMORY, "out of memory");
        }
        lib->n_modules++;
    }
    for (i = 0; i < lib->n_functions; i++)
        if (lib->functions[i].module == m && strcmp(lib->functions[i].entry, entry) == 0) {
            *out = lib->functions[i].function;
            return AEC_OK;
        }
    r = lib->cu.cuModuleGetFunction(&fn, lib->modules[m].module, entry);
    if (r != AECL_CUDA_SUCCESS) {
        snprintf(what, sizeof what, "cuModuleGetFunction(%s) in %s", entry, cubin);
        return aecl_driver_fail(lib, r, what);
    }
    if (smem > 0) {
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

/* Launches `fn` with blockDim (threads, 1, 1). */
static inline int aecl_launch(aec_library *lib, aecl_CUfunction fn, const uint64_t grid[3], unsigned int threads,
                              unsigned int smem, void *stream, void **args, const char *caller, const char *entry)
{
    aecl_CUresult r = lib->cu.cuLaunchKernel(fn, (unsigned int)grid[0], (unsigned int)grid[1], (unsigned int)grid[2],
                                             threads, 1, 1, smem, (aecl_CUstream)stream, args, NULL);
    if (r != AECL_CUDA_SUCCESS) {
        char what[512];
        snprintf(what, sizeof what, "%s: cuLaunchKernel(%s, grid (%llu, %llu, %llu), %u threads, %u bytes of shared memory)",
                 caller, entry, (unsigned long long)grid[0], (unsigned long long)grid[1],
                 (unsigned long long)grid[2], threads, smem);
        return aecl_driver_fail(lib, r, what);
    }
    return AEC_OK;
}

/* Fills `bytes` bytes at `p` with zeros on `stream` (p == 0: nothing). */
static inline int aecl_zero(aec_library *lib, aecl_CUdeviceptr p, uint64_t bytes, void *stream, const char *caller,
                            const char *buffer)
{
    aecl_CUresult r;
    char what[256];
    if (p == 0 || bytes == 0)
        return AEC_OK;
    if (bytes % 4 == 0)
        r = lib->cu.cuMemsetD32Async(p, 0u, (size_t)(bytes / 4), (aecl_CUstream)stream);
    else
        r = lib->cu.cuMemsetD16Async(p, 0u, (size_t)(bytes / 2), (aecl_CUstream)stream);
    if (r != AECL_CUDA_SUCCESS) {
        snprintf(what, sizeof what, "%s: zero-filling %s (%llu bytes)", caller, buffer, (unsigned long long)bytes);
        return aecl_driver_fail(lib, r, what);
    }
    return AEC_OK;
}

/* Allocates a call's workspace when the caller gave none. */
static inline int aecl_workspace_alloc(aec_library *lib, uint64_t bytes, aecl_CUdeviceptr *p, const char *caller)
{
    aecl_CUresult r;
    char what[256];
    if ((uint64_t)(size_t)bytes != bytes)
        return aecl_fail(lib->error, sizeof lib->error, AEC_ERROR_SHAPE,
                         "%s: the workspace would be %llu bytes, more than size_t holds", caller,
                         (unsigned long long)bytes);
    r = lib->cu.cuMemAlloc(p, (size_t)bytes);
    if (r != AECL_CUDA_SUCCESS) {
        snprintf(what, sizeof what, "%s: cuMemAlloc of the workspace (%llu bytes)", caller, (unsigned long long)bytes);
        return aecl_driver_fail(lib, r, what);
    }
    return AEC_OK;
}

/* Waits for `stream` and frees a workspace the call allocated; returns
   `status` when it is already an error, else the result of the two. */
static inline int aecl_workspace_release(aec_library *lib, aecl_CUdeviceptr p, void *stream, int status,
                                         const char *caller)
{
    char what[256];
    aecl_CUresult r = lib->cu.cuStreamSynchronize((aecl_CUstream)stream);
    aecl_CUresult f = lib->cu.cuMemFree(p);
    if (status != AEC_OK)
        return status;
    if (r != AECL_CUDA_SUCCESS) {
        snprintf(what, sizeof what, "%s: cuStreamSynchronize before freeing the workspace", caller);
        return aecl_driver_fail(lib, r, what);
    }
    if (f != AECL_CUDA_SUCCESS) {
        snprintf(what, sizeof what, "%s: cuMemFree of the workspace", caller);
        return aecl_driver_fail(lib, f, what);
    }
    return AEC_OK;
}

/* ---- device memory, for programs that use nothing but this library ---- */

/* Allocates `bytes` of device memory (cuMemAlloc: 256-byte aligned or more). */
static inline int aec_device_alloc(aec_library *lib, size_t bytes, void **ptr)
{
    aecl_CUdeviceptr p = 0;
    aecl_CUresult r;
    int status;
    if (lib == NULL || ptr == NULL)
        return lib == NULL ? AEC_ERROR_ARGUMENT
                           : aecl_fail(lib->error, sizeof lib->error, AEC_ERROR_ARGUMENT, "aec_device_alloc: ptr is NULL");
    *ptr = NULL;
    if ((status = aecl_enter(lib, "aec_device_alloc")) != AEC_OK)
        return status;
    r = lib->cu.cuMemAlloc(&p, bytes);
    if (r != AECL_CUDA_SUCCESS) {
        char what[128];
        snprintf(what, sizeof what, "aec_device_alloc: cuMemAlloc(%lu bytes)", (unsigned long)bytes);
        return aecl_driver_fail(lib, r, what);
    }
    *ptr = (void *)(uintptr_t)p;
    return AEC_OK;
}

/* Frees memory from aec_device_alloc (NULL: nothing). */
static inline int aec_device_free(aec_library *lib, void *ptr)
{
    aecl_CUresult r;
    int status;
    if (lib == NULL)
        return AEC_ERROR_ARGUMENT;
    if (ptr == NULL)
        return AEC_OK;
    if ((status = aecl_enter(lib, "aec_device_free")) != AEC_OK)
        return status;
    r = lib->cu.cuMemFree(aecl_dptr(ptr));
    return r == AECL_CUDA_SUCCESS ? AEC_OK : aecl_driver_fail(lib, r, "aec_device_free: cuMemFree");
}

/* Copies `bytes` from host memory to device memory (synchronous). */
static inline int aec_copy_to_device(aec_library *lib, void *device_dst, const void *host_src, size_t bytes)
{
    aecl_CUresult r;
    int status;
    if (lib == NULL)
        return AEC_ERROR_ARGUMENT;
    if ((device_dst == NULL || host_src == NULL) && bytes > 0)
        return aecl_fail(lib->error, sizeof lib->error, AEC_ERROR_ARGUMENT,
                         "aec_copy_to_device: a NULL pointer with %lu bytes to copy", (unsigned long)bytes);
    if ((status = aecl_enter(lib, "aec_copy_to_device")) != AEC_OK)
        return status;
    if (bytes == 0)
        return AEC_OK;
    r = lib->cu.cuMemcpyHtoD(aecl_dptr(device_dst), host_src, bytes);
    return r == AECL_CUDA_SUCCESS ? AEC_OK : aecl_driver_fail(lib, r, "aec_copy_to_device: cuMemcpyHtoD");
}

/* Copies `bytes` from device memory to host memory (synchronous). */
static inline int aec_copy_to_host(aec_library *lib, void *host_dst, const void *device_src, size_t bytes)
{
    aecl_CUresult r;
    int status;
    if (lib == NULL)
        return AEC_ERROR_ARGUMENT;
    if ((host_dst == NULL || device_src == NULL) && bytes > 0)
        return aecl_fail(lib->error, sizeof lib->error, AEC_ERROR_ARGUMENT,
                         "aec_copy_to_host: a NULL pointer with %lu bytes to copy", (unsigned long)bytes);
    if ((status = aecl_enter(lib, "aec_copy_to_host")) != AEC_OK)
        return status;
    if (bytes == 0)
        return AEC_OK;
    r = lib->cu.cuMemcpyDtoH(host_dst, aecl_dptr(device_src), bytes);
    return r == AECL_CUDA_SUCCESS ? AEC_OK : aecl_driver_fail(lib, r, "aec_copy_to_host: cuMemcpyDtoH");
}

/* Waits for all work in the library's context (kernel faults surface here). */
static inline int aec_synchronize(aec_library *lib)
{
    aecl_CUresult r;
    int status;
    if (lib == NULL)
        return AEC_ERROR_ARGUMENT;
    if ((status = aecl_enter(lib, "aec_synchronize")) != AEC_OK)
        return status;
    r = lib->cu.cuCtxSynchronize();
    return r == AECL_CUDA_SUCCESS ? AEC_OK : aecl_driver_fail(lib, r, "aec_synchronize: cuCtxSynchronize");
}

/* Waits for the work on `stream` (a CUstream; NULL: the default stream). */
static inline int aec_stream_synchronize(aec_library *lib, void *stream)
{
    aecl_CUresult r;
    int status;
    if (lib == NULL)
        return AEC_ERROR_ARGUMENT;
    if ((status = aecl_enter(lib, "aec_stream_synchronize")) != AEC_OK)
        return status;
    r = lib->cu.cuStreamSynchronize((aecl_CUstream)stream);
    return r == AECL_CUDA_SUCCESS ? AEC_OK
                                  : aecl_driver_fail(lib, r, "aec_stream_synchronize: cuStreamSynchronize");
}

#ifdef __cplusplus
}
#endif

#endif /* AEC_LOADER_H */
