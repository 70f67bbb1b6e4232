/*
 * A test double of the CUDA driver (libcuda.so.1) for the C loader's CUDA
 * backend on machines without an NVIDIA GPU (tests/library_c.rs builds it as
 * DIR/libcuda.so.1, found first through LD_LIBRARY_PATH). It plays one
 * H100-like device (compute capability 9.0, so the loader picks the sm_90a
 * builds; 132 multiprocessors):
 *
 * - device memory is host memory (cuMemAlloc is aligned_alloc), so copies
 *   and memsets really move bytes;
 * - cuModuleLoadData accepts any ELF image (a cubin) and cuModuleGetFunction
 *   any name;
 * - cuTensorMapEncodeTiled refuses a map that is not 64-byte aligned or not
 *   of rank 3, and otherwise writes what it was given into the map's 128
 *   bytes (fake_map below), which the launch log decodes;
 *   $AEC_FAKE_CUDA_FAIL_ENCODE=1 makes it fail with
 *   CUDA_ERROR_INVALID_VALUE. Built with -DFAKE_CUDA_NO_TENSOR_MAP it lacks
 *   the symbol, as drivers before CUDA 12 do;
 * - cuOccupancyMaxActiveBlocksPerMultiprocessor answers
 *   $AEC_FAKE_CUDA_RESIDENT, or fails without it;
 * - cuLaunchKernel runs nothing: it appends one line per launch to the file
 *   named by $AEC_FAKE_CUDA_LOG: entry, grid, block, shared memory and the
 *   arguments, decoded as $AEC_FAKE_CUDA_ARGS says: one letter per
 *   parameter, `p` a 64-bit pointer (`p<hex>`), `i` a 32-bit int
 *   (`i<decimal>`), `m` a tensor map passed by value (`m<fields>`, or
 *   `m?` when the bytes are not a map this double encoded, `m!` when the
 *   parameter is not 64-byte aligned); a list "ppim,ppi" gives the launches
 *   in turn, the last one repeating.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAKE_SUCCESS 0
#define FAKE_INVALID_VALUE 1
#define FAKE_OUT_OF_MEMORY 2
#define FAKE_INVALID_IMAGE 200
#define FAKE_NOT_FOUND 500

/* What the double's encoder writes into a CUtensorMap's 128 bytes. */
typedef struct fake_map {
    uint64_t magic; /* FAKE_MAP_MAGIC */
    uint64_t data_type, rank, address;
    uint64_t dims[3], strides[2];
    uint32_t box[3], element_strides[3];
    uint32_t interleave, swizzle, l2_promotion, oob_fill;
} fake_map;

#define FAKE_MAP_MAGIC 0x70616d726f736e65ull

typedef char fake_map_fits[sizeof(fake_map) <= 128 ? 1 : -1];

typedef struct fake_function {
    char name[256];
} fake_function;

static void *current_context = NULL;
static char primary_context;

int cuGetErrorName(int e, const char **name)
{
    switch (e) {
    case FAKE_SUCCESS: *name = "CUDA_SUCCESS"; return FAKE_SUCCESS;
    case FAKE_INVALID_VALUE: *name = "CUDA_ERROR_INVALID_VALUE"; return FAKE_SUCCESS;
    case FAKE_OUT_OF_MEMORY: *name = "CUDA_ERROR_OUT_OF_MEMORY"; return FAKE_SUCCESS;
    case FAKE_INVALID_IMAGE: *name = "CUDA_ERROR_INVALID_IMAGE"; return FAKE_SUCCESS;
    case FAKE_NOT_FOUND: *name = "CUDA_ERROR_NOT_FOUND"; return FAKE_SUCCESS;
    default: return FAKE_INVALID_VALUE;
    }
}

int cuGetErrorString(int e, const char **text)
{
    *text = e == FAKE_INVALID_VALUE ? "invalid argument" : "the test double's error";
    return FAKE_SUCCESS;
}

int cuInit(unsigned int flags)
{
    return flags == 0 ? FAKE_SUCCESS : FAKE_INVALID_VALUE;
}

int cuDeviceGet(int *device, int ordinal)
{
    if (ordinal != 0)
        return FAKE_INVALID_VALUE;
    *device = 0;
    return FAKE_SUCCESS;
}

int cuDeviceGetAttribute(int *v, int attr, int device)
{
    if (device != 0)
        return FAKE_INVALID_VALUE;
    switch (attr) {
    case 75: *v = 9; return FAKE_SUCCESS;       /* compute capability major */
    case 76: *v = 0; return FAKE_SUCCESS;       /* compute capability minor */
    case 16: *v = 132; return FAKE_SUCCESS;     /* multiprocessors */
    case 81: *v = 233472; return FAKE_SUCCESS;  /* shared memory per multiprocessor */
    default: return FAKE_INVALID_VALUE;
    }
}

int cuDeviceGetName(char *name, int len, int device)
{
    if (device != 0 || len < 1)
        return FAKE_INVALID_VALUE;
    snprintf(name, (size_t)len, "NVIDIA H100 (aec test double)");
    return FAKE_SUCCESS;
}

int cuCtxGetCurrent(void **ctx)
{
    *ctx = current_context;
    return FAKE_SUCCESS;
}

int cuCtxSetCurrent(void *ctx)
{
    current_context = ctx;
    return FAKE_SUCCESS;
}

int cuCtxGetDevice(int *device)
{
    *device = 0;
    return FAKE_SUCCESS;
}

int cuCtxSynchronize(void)
{
    return FAKE_SUCCESS;
}

int cuDevicePrimaryCtxRetain(void **ctx, int device)
{
    if (device != 0)
        return FAKE_INVALID_VALUE;
    *ctx = &primary_context;
    return FAKE_SUCCESS;
}

int cuDevicePrimaryCtxRelease_v2(int device)
{
    return device == 0 ? FAKE_SUCCESS : FAKE_INVALID_VALUE;
}

int cuModuleLoadData(void **module, const void *image)
{
    static char loaded;
    if (image == NULL || memcmp(image, "\x7f" "ELF", 4) != 0)
        return FAKE_INVALID_IMAGE;
    *module = &loaded;
    return FAKE_SUCCESS;
}

int cuModuleUnload(void *module)
{
    return module != NULL ? FAKE_SUCCESS : FAKE_INVALID_VALUE;
}

int cuModuleGetFunction(void **function, void *module, const char *name)
{
    fake_function *f;
    size_t n = strlen(name) + 1;
    if (module == NULL || n > sizeof f->name)
        return FAKE_INVALID_VALUE;
    f = (fake_function *)malloc(sizeof *f);
    if (f == NULL)
        return FAKE_OUT_OF_MEMORY;
    memcpy(f->name, name, n);
    *function = f;
    return FAKE_SUCCESS;
}

int cuFuncSetAttribute(void *function, int attr, int value)
{
    (void)attr;
    return function != NULL && value >= 0 ? FAKE_SUCCESS : FAKE_INVALID_VALUE;
}

#ifndef FAKE_CUDA_NO_TENSOR_MAP
int cuTensorMapEncodeTiled(void *map, int data_type, uint32_t rank, void *address, const uint64_t *dims,
                           const uint64_t *strides, const uint32_t *box, const uint32_t *element_strides,
                           int interleave, int swizzle, int l2_promotion, int oob_fill)
{
    fake_map m;
    const char *fail = getenv("AEC_FAKE_CUDA_FAIL_ENCODE");
    uint32_t d;
    if (fail != NULL && strcmp(fail, "1") == 0)
        return FAKE_INVALID_VALUE;
    if (map == NULL || (uintptr_t)map % 64 != 0 || rank != 3 || address == NULL)
        return FAKE_INVALID_VALUE;
    memset(&m, 0, sizeof m);
    m.magic = FAKE_MAP_MAGIC;
    m.data_type = (uint64_t)data_type;
    m.rank = rank;
    m.address = (uint64_t)(uintptr_t)address;
    for (d = 0; d < 3; d++) {
        m.dims[d] = dims[d];
        m.box[d] = box[d];
        m.element_strides[d] = element_strides[d];
    }
    m.strides[0] = strides[0];
    m.strides[1] = strides[1];
    m.interleave = (uint32_t)interleave;
    m.swizzle = (uint32_t)swizzle;
    m.l2_promotion = (uint32_t)l2_promotion;
    m.oob_fill = (uint32_t)oob_fill;
    memset(map, 0, 128);
    memcpy(map, &m, sizeof m);
    return FAKE_SUCCESS;
}
#endif

/* The letters of this launch in $AEC_FAKE_CUDA_ARGS (into `kinds`). */
static int fake_arg_kinds(char *kinds, size_t cap)
{
    static char last[1024];
    static int launch;
    const char *spec = getenv("AEC_FAKE_CUDA_ARGS"), *at, *end;
    int k;
    size_t n;
    kinds[0] = '\0';
    if (spec == NULL)
        return 0;
    if (strncmp(last, spec, sizeof last) != 0) {
        strncpy(last, spec, sizeof last - 1);
        launch = 0;
    }
    at = spec;
    for (k = 0; k < launch && strchr(at, ',') != NULL; k++)
        at = strchr(at, ',') + 1;
    launch++;
    end = strchr(at, ',');
    n = end != NULL ? (size_t)(end - at) : strlen(at);
    if (n >= cap)
        return -1;
    memcpy(kinds, at, n);
    kinds[n] = '\0';
    return 0;
}

int cuLaunchKernel(void *function, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                   unsigned int by, unsigned int bz, unsigned int smem, void *stream, void **params, void **extra)
{
    fake_function *f = (fake_function *)function;
    const char *log = getenv("AEC_FAKE_CUDA_LOG");
    char kinds[256];
    size_t i;
    FILE *out;
    (void)stream;
    if (f == NULL || extra != NULL || fake_arg_kinds(kinds, sizeof kinds) != 0)
        return FAKE_INVALID_VALUE;
    if (log == NULL)
        return FAKE_SUCCESS;
    out = fopen(log, "a");
    if (out == NULL)
        return FAKE_INVALID_VALUE;
    fprintf(out, "launch %s grid %u %u %u block %u %u %u smem %u args", f->name, gx, gy, gz, bx, by, bz, smem);
    for (i = 0; kinds[i] != '\0'; i++) {
        if (kinds[i] == 'p') {
            uint64_t p;
            memcpy(&p, params[i], sizeof p);
            fprintf(out, " p%llx", (unsigned long long)p);
        } else if (kinds[i] == 'i') {
            int32_t v;
            memcpy(&v, params[i], sizeof v);
            fprintf(out, " i%d", (int)v);
        } else if (kinds[i] == 'm') {
            fake_map m;
            if ((uintptr_t)params[i] % 64 != 0) {
                fprintf(out, " m!");
                continue;
            }
            memcpy(&m, params[i], sizeof m);
            if (m.magic != FAKE_MAP_MAGIC) {
                fprintf(out, " m?");
                continue;
            }
            fprintf(out, " m%llu,%llu,%llx,%llux%llux%llu,%llux%llu,%ux%ux%u,%ux%ux%u,%u,%u,%u,%u",
                    (unsigned long long)m.data_type, (unsigned long long)m.rank, (unsigned long long)m.address,
                    (unsigned long long)m.dims[0], (unsigned long long)m.dims[1], (unsigned long long)m.dims[2],
                    (unsigned long long)m.strides[0], (unsigned long long)m.strides[1], m.box[0], m.box[1],
                    m.box[2], m.element_strides[0], m.element_strides[1], m.element_strides[2], m.interleave,
                    m.swizzle, m.l2_promotion, m.oob_fill);
        } else {
            fprintf(out, " ?");
        }
    }
    fprintf(out, "\n");
    fclose(out);
    return FAKE_SUCCESS;
}

int cuMemAlloc_v2(uint64_t *p, size_t bytes)
{
    void *h = aligned_alloc(256, (bytes + 255) / 256 * 256);
    *p = (uint64_t)(uintptr_t)h;
    return h != NULL ? FAKE_SUCCESS : FAKE_OUT_OF_MEMORY;
}

int cuMemFree_v2(uint64_t p)
{
    free((void *)(uintptr_t)p);
    return FAKE_SUCCESS;
}

int cuMemcpyHtoD_v2(uint64_t dst, const void *src, size_t bytes)
{
    memcpy((void *)(uintptr_t)dst, src, bytes);
    return FAKE_SUCCESS;
}

int cuMemcpyDtoH_v2(void *dst, uint64_t src, size_t bytes)
{
    memcpy(dst, (const void *)(uintptr_t)src, bytes);
    return FAKE_SUCCESS;
}

int cuMemsetD32Async(uint64_t dst, unsigned int value, size_t count, void *stream)
{
    size_t i;
    (void)stream;
    for (i = 0; i < count; i++)
        memcpy((char *)(uintptr_t)dst + 4 * i, &value, 4);
    return FAKE_SUCCESS;
}

int cuMemsetD16Async(uint64_t dst, unsigned short value, size_t count, void *stream)
{
    size_t i;
    (void)stream;
    for (i = 0; i < count; i++)
        memcpy((char *)(uintptr_t)dst + 2 * i, &value, 2);
    return FAKE_SUCCESS;
}

int cuStreamSynchronize(void *stream)
{
    (void)stream;
    return FAKE_SUCCESS;
}

/* The occupancy count $AEC_FAKE_CUDA_RESIDENT (blocks per multiprocessor);
   without it CUDA_ERROR_INVALID_VALUE, so the loader caps KV splits by
   shared memory alone. */
int cuOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, void *function, int threads, size_t smem)
{
    const char *n = getenv("AEC_FAKE_CUDA_RESIDENT");
    (void)smem;
    if (blocks == NULL || function == NULL || threads <= 0 || n == NULL)
        return FAKE_INVALID_VALUE;
    *blocks = atoi(n);
    return FAKE_SUCCESS;
}
