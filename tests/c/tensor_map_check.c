/*
 * tensor_map_check LIBDIR MODE: the Softmax forward of a library built for
 * h100 (whose sm_90a kernel takes tensor maps of q, k and v by value)
 * through the generated C interface, against the test doubles of the
 * drivers (tests/c/fake_cuda.c, tests/c/fake_hip.c), for
 * tests/library_c.rs, which checks what this prints against the plan:
 *
 *   run   the call with B=2, H=3, Sq=70, Skv=301 (the double logs the
 *         launch and decodes the maps), then sizes whose map extents pass
 *         2^32 (refused before the driver);
 *   fail  the same call with the double's encoder failing;
 *   old   the same call on a driver without cuTensorMapEncodeTiled;
 *   hip   the same call on the HIP backend, whose build of that record has
 *         tensor maps (which HIP has no equivalent of).
 *
 * Prints "ptrs q=<hex> k=<hex> v=<hex> o=<hex> row_outputs=<hex>", then one
 * "call <what>: <status> <message>" line per call. Exit 0 when the library
 * opened and every call returned; 1 when it did not open; 2 bad usage.
 */
#include "aec_library.h"

#ifndef AEC_HAVE_SOFTMAX_FORWARD
#error "tensor_map_check needs a library with the Softmax forward (examples/softmax.rs)"
#endif

static void report(aec_library *lib, const char *what, int status)
{
    printf("call %s: %s %s\n", what, aec_status_name(status), aec_last_error(lib));
}

static void *device_buffer(aec_library *lib, size_t bytes)
{
    void *p = NULL;
    if (aec_device_alloc(lib, bytes, &p) != AEC_OK) {
        fprintf(stderr, "tensor_map_check: aec_device_alloc(%lu): %s\n", (unsigned long)bytes, aec_last_error(lib));
        exit(1);
    }
    return p;
}

int main(int argc, char **argv)
{
    aec_library lib;
    aec_softmax_sizes s;
    aec_softmax_forward_buffers f;
    const char *mode;
    size_t nq, nkv, nv, no;
    int st, hip;
    if (argc != 3) {
        fprintf(stderr, "usage: tensor_map_check LIBDIR run|fail|old|hip\n");
        return 2;
    }
    mode = argv[2];
    hip = strcmp(mode, "hip") == 0;
    st = aec_library_open_backend(&lib, argv[1], hip ? AEC_BACKEND_HIP : AEC_BACKEND_CUDA);
    if (st != AEC_OK) {
        fprintf(stderr, "tensor_map_check: %s: %s\n", aec_status_name(st), aec_last_error(&lib));
        return 1;
    }
    printf("open %s %s\n", lib.arch, lib.device_name);
    s.B = 2; s.H = 3; s.Hkv = 3; s.Sq = 70; s.Skv = 301; s.Dqk = AEC_SOFTMAX_DQK; s.Dv = AEC_SOFTMAX_DV;
    nq = (size_t)s.B * s.H * s.Sq * s.Dqk;
    nkv = (size_t)s.B * s.Hkv * s.Skv * s.Dqk;
    nv = (size_t)s.B * s.Hkv * s.Skv * s.Dv;
    no = (size_t)s.B * s.H * s.Sq * s.Dv;
    f.q = device_buffer(&lib, nq * 2);
    f.k = device_buffer(&lib, nkv * 2);
    f.v = device_buffer(&lib, nv * 2);
    f.o = device_buffer(&lib, no * 2);
    f.row_outputs = (float *)device_buffer(&lib, (size_t)4 * s.B * s.H * s.Sq * 4);
    printf("ptrs q=%llx k=%llx v=%llx o=%llx row_outputs=%llx\n", (unsigned long long)(uintptr_t)f.q,
           (unsigned long long)(uintptr_t)f.k, (unsigned long long)(uintptr_t)f.v,
           (unsigned long long)(uintptr_t)f.o, (unsigned long long)(uintptr_t)f.row_outputs);
    printf("kernel %s\n", aec_softmax_forward_kernel(&lib, &s) != NULL ? aec_softmax_forward_kernel(&lib, &s) : "none");
    report(&lib, "forward", aec_softmax_forward(&lib, &s, &f, NULL, NULL));
    if (strcmp(mode, "run") == 0) {
        /* B * H = 4.9e9 map rows: more than a tensor map's 2^32. */
        s.B = 70000; s.H = 70000; s.Hkv = 70000; s.Sq = 1; s.Skv = 1;
        report(&lib, "huge", aec_softmax_forward(&lib, &s, &f, NULL, NULL));
        printf("huge workspace_bytes %s\n",
               aec_softmax_forward_workspace_bytes(&lib, &s) == AEC_WORKSPACE_INVALID ? "invalid" : "valid");
    }
    aec_device_free(&lib, (void *)(uintptr_t)f.q);
    aec_device_free(&lib, (void *)(uintptr_t)f.k);
    aec_device_free(&lib, (void *)(uintptr_t)f.v);
    aec_device_free(&lib, f.o);
    aec_device_free(&lib, f.row_outputs);
    aec_library_close(&lib);
    return 0;
}
