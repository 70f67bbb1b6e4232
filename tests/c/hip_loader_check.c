/*
 * The C loader's HIP backend against tests/c/fake_hip.c, the test double of
 * ROCm's runtime (tests/library_hip_loader.rs builds and runs it): a
 * softmax and Mamba2 library built for mi250 and mi300x opens on the
 * double's gfx942 device, picks the gfx942 code objects, moves bytes,
 * launches the softmax forward and backward and the Mamba2 (recurrent)
 * forward (the double logs the launches; the Rust test checks the log
 * against the manifest's plans), and reports a failed launch and a wrong
 * current device by name.
 *
 * Prints "forward ptrs P...", "backward ptrs P...", "mamba2 ptrs P..." and "mamba2 bwd ptrs P..."
 * lines for the Rust test; exits 0 when every check here passed.
 */
#include "aec_library.h"

#include <dlfcn.h>

static int failures = 0;

#define CHECK(cond, ...)                                                                                              \
    do {                                                                                                              \
        if (!(cond)) {                                                                                                \
            failures++;                                                                                               \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                                     \
            fprintf(stderr, __VA_ARGS__);                                                                             \
            fprintf(stderr, "\n");                                                                                    \
        }                                                                                                             \
    } while (0)

static void *device_buffer(aec_library *lib, size_t bytes, unsigned seed)
{
    void *p = NULL;
    unsigned char *host = (unsigned char *)malloc(bytes), *back = (unsigned char *)malloc(bytes);
    size_t i;
    int st = aec_device_alloc(lib, bytes, &p);
    CHECK(st == AEC_OK && p != NULL, "aec_device_alloc(%lu): %s", (unsigned long)bytes, aec_last_error(lib));
    if (host == NULL || back == NULL || p == NULL) {
        free(host);
        free(back);
        return p;
    }
    for (i = 0; i < bytes; i++)
        host[i] = (unsigned char)((i * 2654435761u + seed) >> 13);
    CHECK(aec_copy_to_device(lib, p, host, bytes) == AEC_OK, "aec_copy_to_device: %s", aec_last_error(lib));
    CHECK(aec_copy_to_host(lib, back, p, bytes) == AEC_OK, "aec_copy_to_host: %s", aec_last_error(lib));
    CHECK(memcmp(host, back, bytes) == 0, "the bytes copied to the device and back differ");
    free(host);
    free(back);
    return p;
}

int main(int argc, char **argv)
{
    aec_library lib;
    aec_softmax_sizes s;
    aec_softmax_forward_buffers f;
    aec_softmax_backward_buffers b;
    size_t q_bytes, kv_bytes, rows_bytes;
    const char *kernel;
    int st;
    if (argc != 2) {
        fprintf(stderr, "usage: %s LIBDIR\n", argv[0]);
        return 2;
    }
    st = aec_library_open(&lib, argv[1]);
    if (st != AEC_OK) {
        fprintf(stderr, "FAIL aec_library_open: %s: %s\n", aec_status_name(st), aec_last_error(&lib));
        return 1;
    }
    printf("opened on %s (%s, %d compute units)\n", lib.device_name, lib.arch, lib.sm_count);
    CHECK(lib.backend == AEC_BACKEND_HIP, "backend %d, not HIP", lib.backend);
    CHECK(strcmp(lib.arch, "gfx942") == 0, "arch %s, not gfx942", lib.arch);
    CHECK(lib.sm_count == 304, "%d compute units, not 304", lib.sm_count);
    CHECK(strstr(lib.device_name, "MI300X") != NULL, "device name %s", lib.device_name);

    /* Sizes that are no tile multiple. */
    s.B = 2;
    s.H = 3;
    s.Hkv = 3;
    s.Sq = 77;
    s.Skv = 100;
    s.Dqk = 128;
    s.Dv = 128;
    q_bytes = (size_t)s.B * s.H * s.Sq * 128 * 2;
    kv_bytes = (size_t)s.B * s.H * s.Skv * 128 * 2;
    rows_bytes = (size_t)3 * s.B * s.H * s.Sq * 4;

    kernel = aec_softmax_forward_kernel(&lib, &s);
    CHECK(kernel != NULL && strstr(kernel, "_gfx942") != NULL, "forward kernel %s", kernel ? kernel : "(none)");
    printf("forward kernel %s\n", kernel ? kernel : "(none)");

    f.q = device_buffer(&lib, q_bytes, 1);
    f.k = device_buffer(&lib, kv_bytes, 2);
    f.v = device_buffer(&lib, kv_bytes, 3);
    f.o = device_buffer(&lib, q_bytes, 4);
    f.row_outputs = (float *)device_buffer(&lib, rows_bytes, 5);
    setenv("AEC_FAKE_HIP_ARGS", "5:5", 1);
    st = aec_softmax_forward(&lib, &s, &f, NULL, NULL);
    CHECK(st == AEC_OK, "forward: %s: %s", aec_status_name(st), aec_last_error(&lib));
    printf("forward ptrs %llx %llx %llx %llx %llx\n", (unsigned long long)(uintptr_t)f.q,
           (unsigned long long)(uintptr_t)f.k, (unsigned long long)(uintptr_t)f.v, (unsigned long long)(uintptr_t)f.o,
           (unsigned long long)(uintptr_t)f.row_outputs);

    b.q = f.q;
    b.k = f.k;
    b.v = f.v;
    b.o = f.o;
    b.row_outputs = f.row_outputs;
    b.dout = device_buffer(&lib, q_bytes, 6);
    b.dq = device_buffer(&lib, q_bytes, 7);
    b.dk = device_buffer(&lib, kv_bytes, 8);
    b.dv = device_buffer(&lib, kv_bytes, 9);
    setenv("AEC_FAKE_HIP_ARGS", "12:5", 1);
    /* No workspace given: the call allocates it with hipMalloc, zero-fills
       what must start at zero, and frees it after hipStreamSynchronize. */
    st = aec_softmax_backward(&lib, &s, &b, NULL, NULL);
    CHECK(st == AEC_OK, "backward: %s: %s", aec_status_name(st), aec_last_error(&lib));
    printf("backward ptrs %llx %llx %llx %llx %llx %llx %llx %llx %llx\n", (unsigned long long)(uintptr_t)b.q,
           (unsigned long long)(uintptr_t)b.k, (unsigned long long)(uintptr_t)b.v, (unsigned long long)(uintptr_t)b.o,
           (unsigned long long)(uintptr_t)b.dout, (unsigned long long)(uintptr_t)b.row_outputs,
           (unsigned long long)(uintptr_t)b.dq, (unsigned long long)(uintptr_t)b.dk,
           (unsigned long long)(uintptr_t)b.dv);
    printf("backward workspace bytes %lu\n", (unsigned long)aec_softmax_backward_workspace_bytes(&lib, &s));
    unsetenv("AEC_FAKE_HIP_ARGS");

    /* The recurrent forward (Mamba2): a length that is no chunk multiple,
       an initial state in, the final state out. */
    {
        aec_mamba2_sizes ms;
        aec_mamba2_forward_buffers mb;
        size_t qk_bytes, v_bytes, state_bytes;
        ms.B = 2;
        ms.H = 3;
        ms.S = 150;
        ms.Dk = AEC_MAMBA2_DK;
        ms.Dv = AEC_MAMBA2_DV;
        qk_bytes = (size_t)ms.B * ms.H * ms.S * ms.Dk * 2;
        v_bytes = (size_t)ms.B * ms.H * ms.S * ms.Dv * 2;
        state_bytes = (size_t)ms.B * ms.H * ms.Dk * ms.Dv * 4;
        kernel = aec_mamba2_forward_kernel(&lib, &ms);
        CHECK(kernel != NULL && strstr(kernel, "aec_rec_fwd_mamba2") != NULL && strstr(kernel, "_gfx942") != NULL,
              "Mamba2 forward kernel %s", kernel ? kernel : "(none)");
        mb.q = device_buffer(&lib, qk_bytes, 11);
        mb.k = device_buffer(&lib, qk_bytes, 12);
        mb.v = device_buffer(&lib, v_bytes, 13);
        mb.a = (const float *)device_buffer(&lib, (size_t)ms.H * 4, 14);
        mb.dt = (const float *)device_buffer(&lib, (size_t)ms.B * ms.H * ms.S * 4, 15);
        mb.o = device_buffer(&lib, v_bytes, 16);
        mb.state_in = (const float *)device_buffer(&lib, state_bytes, 17);
        mb.state_out = (float *)device_buffer(&lib, state_bytes, 18);
        setenv("AEC_FAKE_HIP_ARGS", "9:3", 1);
        st = aec_mamba2_forward(&lib, &ms, &mb, NULL, NULL);
        CHECK(st == AEC_OK, "Mamba2 forward: %s: %s", aec_status_name(st), aec_last_error(&lib));
        printf("mamba2 ptrs %llx %llx %llx %llx %llx %llx %llx %llx\n", (unsigned long long)(uintptr_t)mb.q,
               (unsigned long long)(uintptr_t)mb.k, (unsigned long long)(uintptr_t)mb.v,
               (unsigned long long)(uintptr_t)mb.a, (unsigned long long)(uintptr_t)mb.dt,
               (unsigned long long)(uintptr_t)mb.o, (unsigned long long)(uintptr_t)mb.state_in,
               (unsigned long long)(uintptr_t)mb.state_out);
        unsetenv("AEC_FAKE_HIP_ARGS");
        /* Head dims the library was not built for: refused before any launch. */
        ms.Dk = 64;
        st = aec_mamba2_forward(&lib, &ms, &mb, NULL, NULL);
        CHECK(st == AEC_ERROR_SHAPE && strstr(aec_last_error(&lib), "Dk = 64") != NULL, "Mamba2 with Dk 64: %s: %s",
              aec_status_name(st), aec_last_error(&lib));
        printf("mamba2 wrong Dk: %s\n", aec_last_error(&lib));

        /* Its backward: the states pass from the `states` module, then the
           backward kernels, with an initial state and a final state's gradient. */
        {
            aec_mamba2_backward_buffers bb;
            ms.Dk = AEC_MAMBA2_DK;
            bb.q = mb.q;
            bb.k = mb.k;
            bb.v = mb.v;
            bb.a = mb.a;
            bb.dt = mb.dt;
            bb.state_in = mb.state_in;
            bb.do_ = device_buffer(&lib, v_bytes, 19);
            bb.d_state_out = (const float *)device_buffer(&lib, state_bytes, 20);
            bb.dq = device_buffer(&lib, qk_bytes, 21);
            bb.dk = device_buffer(&lib, qk_bytes, 22);
            bb.dv = device_buffer(&lib, v_bytes, 23);
            bb.da = (float *)device_buffer(&lib, (size_t)ms.H * 4, 24);
            bb.ddt = (float *)device_buffer(&lib, (size_t)ms.B * ms.H * ms.S * 4, 25);
            bb.d_state_in = (float *)device_buffer(&lib, state_bytes, 26);
            kernel = aec_mamba2_backward_kernel(&lib, &ms);
            CHECK(kernel != NULL && strstr(kernel, "aec_rec_states_mamba2") != NULL && strstr(kernel, "_gfx942") != NULL,
                  "Mamba2 backward's first kernel %s", kernel ? kernel : "(none)");
            setenv("AEC_FAKE_HIP_ARGS", "9:3,17:3", 1);
            st = aec_mamba2_backward(&lib, &ms, &bb, NULL, NULL);
            CHECK(st == AEC_OK, "Mamba2 backward: %s: %s", aec_status_name(st), aec_last_error(&lib));
            printf("mamba2 bwd ptrs %llx %llx %llx %llx %llx %llx %llx %llx %llx %llx %llx %llx %llx %llx\n",
                   (unsigned long long)(uintptr_t)bb.q, (unsigned long long)(uintptr_t)bb.k,
                   (unsigned long long)(uintptr_t)bb.v, (unsigned long long)(uintptr_t)bb.a,
                   (unsigned long long)(uintptr_t)bb.dt, (unsigned long long)(uintptr_t)bb.do_,
                   (unsigned long long)(uintptr_t)bb.state_in, (unsigned long long)(uintptr_t)bb.d_state_out,
                   (unsigned long long)(uintptr_t)bb.dq, (unsigned long long)(uintptr_t)bb.dk,
                   (unsigned long long)(uintptr_t)bb.dv, (unsigned long long)(uintptr_t)bb.da,
                   (unsigned long long)(uintptr_t)bb.ddt, (unsigned long long)(uintptr_t)bb.d_state_in);
            unsetenv("AEC_FAKE_HIP_ARGS");
        }
    }

    /* A launch the runtime refuses: named with its grid and the HIP error. */
    setenv("AEC_FAKE_HIP_FAIL_LAUNCH", "1", 1);
    st = aec_softmax_forward(&lib, &s, &f, NULL, NULL);
    CHECK(st == AEC_ERROR_DRIVER, "a failed launch gives %s", aec_status_name(st));
    CHECK(strstr(aec_last_error(&lib), "hipModuleLaunchKernel(aec_fwd_softmax") != NULL &&
              strstr(aec_last_error(&lib), "hipErrorLaunchFailure") != NULL,
          "failed launch message: %s", aec_last_error(&lib));
    printf("failed launch: %s\n", aec_last_error(&lib));
    unsetenv("AEC_FAKE_HIP_FAIL_LAUNCH");

    /* Another device current on this thread: refused, nothing launched. */
    {
        void *rt = dlopen("libamdhip64.so", RTLD_NOW | RTLD_LOCAL);
        void *sym = rt != NULL ? dlsym(rt, "hipSetDevice") : NULL;
        int (*set_device)(int) = NULL;
        CHECK(sym != NULL, "hipSetDevice not found in the runtime");
        if (sym != NULL) {
            memcpy(&set_device, &sym, sizeof sym);
            set_device(1);
            st = aec_softmax_forward(&lib, &s, &f, NULL, NULL);
            CHECK(st == AEC_ERROR_ARGUMENT && strstr(aec_last_error(&lib), "current HIP device is 1") != NULL,
                  "another device current: %s: %s", aec_status_name(st), aec_last_error(&lib));
            printf("other device: %s\n", aec_last_error(&lib));
            set_device(0);
        }
        if (rt != NULL)
            dlclose(rt);
    }

    CHECK(aec_device_free(&lib, (void *)f.q) == AEC_OK, "aec_device_free: %s", aec_last_error(&lib));
    CHECK(aec_synchronize(&lib) == AEC_OK, "aec_synchronize: %s", aec_last_error(&lib));
    CHECK(aec_stream_synchronize(&lib, NULL) == AEC_OK, "aec_stream_synchronize: %s", aec_last_error(&lib));
    aec_library_close(&lib);
    printf("%d check(s) failed\n", failures);
    return failures ? 1 : 0;
}
