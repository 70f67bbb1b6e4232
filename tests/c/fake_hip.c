/*
 * A test double of ROCm's HIP runtime (libamdhip64.so) for the loaders' HIP
 * backends on machines without an AMD GPU (tests/library_hip_loader.rs).
 * It is built as a shared library named libamdhip64.so and found first
 * through LD_LIBRARY_PATH. It plays one MI300X-like device (gfx 9.4, 304
 * compute units) and a second device to switch to:
 *
 * - device memory is host memory (hipMalloc is aligned_alloc), so copies and
 *   memsets really move bytes;
 * - hipModuleLoadData accepts only an AMDGPU ELF for gfx942 (as the real
 *   runtime refuses code objects for another GPU) and keeps a copy;
 * - hipModuleGetFunction finds an entry only if its name is in the image;
 * - hipModuleLaunchKernel runs nothing: it appends one line per launch to
 *   the file named by $AEC_FAKE_HIP_LOG: entry, grid, block, shared memory
 *   and the arguments, decoded as $AEC_FAKE_HIP_ARGS says ("P:I": P 64-bit
 *   pointers, then I 32-bit ints; a list "P:I,P:I,…" gives the launches
 *   since the variable last changed their layouts in turn, the last one
 *   repeating). $AEC_FAKE_HIP_FAIL_LAUNCH=1 makes it
 *   fail with hipErrorLaunchFailure.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAKE_SUCCESS 0
#define FAKE_INVALID_VALUE 1
#define FAKE_OUT_OF_MEMORY 2
#define FAKE_INVALID_DEVICE 101
#define FAKE_INVALID_IMAGE 200
#define FAKE_NO_BINARY_FOR_GPU 209
#define FAKE_NOT_FOUND 500
#define FAKE_LAUNCH_FAILURE 719

#define EM_AMDGPU 224
#define MACH_GFX942 0x4c

typedef struct fake_module {
    unsigned char *image;
    size_t size;
} fake_module;

typedef struct fake_function {
    char name[256];
} fake_function;

static int current_device = 0;

const char *hipGetErrorName(int e)
{
    switch (e) {
    case FAKE_SUCCESS: return "hipSuccess";
    case FAKE_INVALID_VALUE: return "hipErrorInvalidValue";
    case FAKE_OUT_OF_MEMORY: return "hipErrorOutOfMemory";
    case FAKE_INVALID_DEVICE: return "hipErrorInvalidDevice";
    case FAKE_INVALID_IMAGE: return "hipErrorInvalidImage";
    case FAKE_NO_BINARY_FOR_GPU: return "hipErrorNoBinaryForGpu";
    case FAKE_NOT_FOUND: return "hipErrorNotFound";
    case FAKE_LAUNCH_FAILURE: return "hipErrorLaunchFailure";
    default: return "hipErrorUnknown";
    }
}

const char *hipGetErrorString(int e)
{
    return e == FAKE_NO_BINARY_FOR_GPU ? "no kernel image is available for this GPU" : "the test double's error";
}

int hipInit(unsigned int flags)
{
    return flags == 0 ? FAKE_SUCCESS : FAKE_INVALID_VALUE;
}

int hipGetDeviceCount(int *n)
{
    *n = 2;
    return FAKE_SUCCESS;
}

int hipGetDevice(int *d)
{
    *d = current_device;
    return FAKE_SUCCESS;
}

int hipSetDevice(int d)
{
    if (d < 0 || d > 1)
        return FAKE_INVALID_DEVICE;
    current_device = d;
    return FAKE_SUCCESS;
}

int hipDeviceGetAttribute(int *v, int attr, int device)
{
    if (device < 0 || device > 1)
        return FAKE_INVALID_DEVICE;
    switch (attr) {
    case 23: *v = 9; return FAKE_SUCCESS;   /* compute capability major */
    case 61: *v = 4; return FAKE_SUCCESS;   /* compute capability minor */
    case 63: *v = 304; return FAKE_SUCCESS; /* multiprocessor count */
    default: return FAKE_INVALID_VALUE;
    }
}

int hipDeviceGetName(char *name, int len, int device)
{
    if (device < 0 || device > 1 || len < 1)
        return FAKE_INVALID_VALUE;
    snprintf(name, (size_t)len, "AMD Instinct MI300X (aec test double)");
    return FAKE_SUCCESS;
}

int hipDeviceSynchronize(void)
{
    return FAKE_SUCCESS;
}

int hipStreamSynchronize(void *stream)
{
    (void)stream;
    return FAKE_SUCCESS;
}

int hipModuleLoadData(void **module, const void *image)
{
    const unsigned char *e = (const unsigned char *)image;
    uint64_t shoff;
    uint16_t machine, shentsize, shnum;
    uint32_t flags;
    fake_module *m;
    if (image == NULL || memcmp(e, "\x7f" "ELF", 4) != 0 || e[4] != 2)
        return FAKE_INVALID_IMAGE;
    memcpy(&machine, e + 18, 2);
    memcpy(&flags, e + 48, 4);
    if (machine != EM_AMDGPU)
        return FAKE_INVALID_IMAGE;
    if ((flags & 0xff) != MACH_GFX942)
        return FAKE_NO_BINARY_FOR_GPU;
    memcpy(&shoff, e + 40, 8);
    memcpy(&shentsize, e + 58, 2);
    memcpy(&shnum, e + 60, 2);
    m = (fake_module *)malloc(sizeof *m);
    if (m == NULL)
        return FAKE_OUT_OF_MEMORY;
    /* The section headers end the file (as the linker lays it out). */
    m->size = (size_t)shoff + (size_t)shentsize * shnum;
    m->image = (unsigned char *)malloc(m->size);
    if (m->image == NULL) {
        free(m);
        return FAKE_OUT_OF_MEMORY;
    }
    memcpy(m->image, image, m->size);
    *module = m;
    return FAKE_SUCCESS;
}

int hipModuleUnload(void *module)
{
    fake_module *m = (fake_module *)module;
    if (m == NULL)
        return FAKE_INVALID_VALUE;
    free(m->image);
    free(m);
    return FAKE_SUCCESS;
}

int hipModuleGetFunction(void **function, void *module, const char *name)
{
    fake_module *m = (fake_module *)module;
    size_t n = strlen(name) + 1, i;
    fake_function *f;
    if (m == NULL || n > sizeof f->name)
        return FAKE_INVALID_VALUE;
    for (i = 0; i + n <= m->size; i++)
        if (memcmp(m->image + i, name, n) == 0)
            break;
    if (i + n > m->size)
        return FAKE_NOT_FOUND;
    f = (fake_function *)malloc(sizeof *f);
    if (f == NULL)
        return FAKE_OUT_OF_MEMORY;
    memcpy(f->name, name, n);
    *function = f;
    return FAKE_SUCCESS;
}

int hipModuleLaunchKernel(void *function, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                          unsigned int by, unsigned int bz, unsigned int smem, void *stream, void **params,
                          void **extra)
{
    fake_function *f = (fake_function *)function;
    const char *log = getenv("AEC_FAKE_HIP_LOG"), *spec = getenv("AEC_FAKE_HIP_ARGS"), *fail = getenv("AEC_FAKE_HIP_FAIL_LAUNCH");
    int pointers = 0, ints = 0, i;
    FILE *out;
    (void)stream;
    if (f == NULL || extra != NULL)
        return FAKE_INVALID_VALUE;
    if (fail != NULL && strcmp(fail, "1") == 0)
        return FAKE_LAUNCH_FAILURE;
    if (spec != NULL) {
        /* The launches since the list changed take its entries in turn. */
        static char last[512];
        static int launch;
        const char *at = spec;
        int k;
        if (strncmp(last, spec, sizeof last) != 0) {
            strncpy(last, spec, sizeof last - 1);
            launch = 0;
        }
        for (k = 0; k < launch && strchr(at, ',') != NULL; k++)
            at = strchr(at, ',') + 1;
        launch++;
        if (sscanf(at, "%d:%d", &pointers, &ints) != 2)
            return FAKE_INVALID_VALUE;
    }
    if (log == NULL)
        return FAKE_SUCCESS;
    out = fopen(log, "a");
    if (out == NULL)
        return FAKE_INVALID_VALUE;
    fprintf(out, "launch %s grid %u %u %u block %u %u %u smem %u args", f->name, gx, gy, gz, bx, by, bz, smem);
    for (i = 0; i < pointers; i++) {
        uint64_t p;
        memcpy(&p, params[i], sizeof p);
        fprintf(out, " p%llx", (unsigned long long)p);
    }
    for (i = 0; i < ints; i++) {
        int32_t v;
        memcpy(&v, params[pointers + i], sizeof v);
        fprintf(out, " i%d", (int)v);
    }
    fprintf(out, "\n");
    fclose(out);
    return FAKE_SUCCESS;
}

int hipMalloc(void **p, size_t bytes)
{
    *p = aligned_alloc(256, (bytes + 255) / 256 * 256);
    return *p != NULL ? FAKE_SUCCESS : FAKE_OUT_OF_MEMORY;
}

int hipFree(void *p)
{
    free(p);
    return FAKE_SUCCESS;
}

int hipMemcpyHtoD(void *dst, void *src, size_t bytes)
{
    memcpy(dst, src, bytes);
    return FAKE_SUCCESS;
}

int hipMemcpyDtoH(void *dst, void *src, size_t bytes)
{
    memcpy(dst, src, bytes);
    return FAKE_SUCCESS;
}

int hipMemsetD32Async(void *dst, int value, size_t count, void *stream)
{
    size_t i;
    (void)stream;
    for (i = 0; i < count; i++)
        memcpy((char *)dst + 4 * i, &value, 4);
    return FAKE_SUCCESS;
}

int hipMemsetD16Async(void *dst, unsigned short value, size_t count, void *stream)
{
    size_t i;
    (void)stream;
    for (i = 0; i < count; i++)
        memcpy((char *)dst + 2 * i, &value, 2);
    return FAKE_SUCCESS;
}
