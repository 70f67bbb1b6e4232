/*
 * api_check LIBDIR: the C interface of an aec kernel library, as a C (or
 * C++) program sees it. Built against LIBDIR/include by tests/library_c.rs
 * (no GPU: the checks before the driver, then the missing-driver message)
 * and by bench/library_c_check.sh (on a GPU: the same checks, then real
 * calls). Each variant's section runs when the library has it
 * (AEC_HAVE_<VARIANT>_<PASS>): Softmax, Alibi, Decode, Mamba2.
 *
 * On the GPU the calls are checked against what holds for any inputs:
 * when v is the same at every key position, attention returns that row
 * (softmax, ALiBi, decoding with KV splits); a zero output gradient gives
 * zero gradients; a recurrence over v = 0 gives zero outputs and states;
 * the recurrent backward (the states pass from its own cubin, then the
 * backward kernels) of a zero output gradient gives zero gradients.
 * Outputs are pre-filled with NaN, so a kernel that writes nothing fails.
 *
 * Exit: 0 all checks passed with a GPU; 3 all checks passed and
 * libcuda.so.1 is absent (the loader's message on stderr); 4 all checks
 * passed and the driver has no usable device (message on stderr); 1 a check
 * failed (FAIL lines on stderr); 2 bad usage.
 */
#include "check_util.h"

/* A non-NULL device pointer for the checks that stop before any launch. */
#define FAKE ((void *)(uintptr_t)0x100000u)

/* Whether the library is open on a GPU (the calls then run). */
static int on_gpu = 0;

/* A device buffer of `n` bf16 NaNs. */
static void *nan_bf16(aec_library *lib, size_t n, const char *what)
{
    void *d = check_upload(lib, NULL, n * 2, what);
    uint16_t *h = (uint16_t *)malloc(n * 2);
    size_t i;
    for (i = 0; i < n; i++)
        h[i] = 0x7fc0u;
    if (aec_copy_to_device(lib, d, h, n * 2) != AEC_OK) {
        fprintf(stderr, "FAIL filling %s: %s\n", what, aec_last_error(lib));
        exit(1);
    }
    free(h);
    return d;
}

static float *download_bf16(aec_library *lib, const void *d, size_t n, const char *what)
{
    uint16_t *h = (uint16_t *)malloc(n * 2);
    float *f = (float *)malloc(n * sizeof *f);
    size_t i;
    if (h == NULL || f == NULL || aec_copy_to_host(lib, h, d, n * 2) != AEC_OK) {
        fprintf(stderr, "FAIL downloading %s: %s\n", what, aec_last_error(lib));
        exit(1);
    }
    for (i = 0; i < n; i++)
        f[i] = check_from_bf16(h[i]);
    free(h);
    return f;
}

/* v[b, hkv, s, :] = u[b, hkv, :] for every s: bf16 [B, Hkv, Skv, Dv]. */
static uint16_t *constant_v(const uint16_t *u, int B, int Hkv, int Skv, int Dv)
{
    size_t n = (size_t)B * Hkv * Skv * Dv, i;
    uint16_t *v = (uint16_t *)malloc(n * 2);
    for (i = 0; i < n; i++) {
        size_t d = i % (size_t)Dv, bh = i / ((size_t)Skv * Dv);
        v[i] = u[bh * (size_t)Dv + d];
    }
    return v;
}

/* o [B, H, Sq, Dv] must be u [B, Hkv, Dv] of each row's kv head. */
static void expect_rows_of_u(const float *o, const uint16_t *u, int B, int H, int Hkv, int Sq, int Dv, const char *what)
{
    double worst = 0.0;
    size_t bad = 0;
    int b, h, i, d;
    char line[256];
    for (b = 0; b < B; b++)
        for (h = 0; h < H; h++)
            for (i = 0; i < Sq; i++)
                for (d = 0; d < Dv; d++) {
                    double want = check_from_bf16(u[((size_t)b * Hkv + (size_t)h / (size_t)(H / Hkv)) * (size_t)Dv + (size_t)d]);
                    double got = o[(((size_t)b * H + (size_t)h) * (size_t)Sq + (size_t)i) * (size_t)Dv + (size_t)d];
                    double e = fabs(got - want);
                    if (!(e <= 2e-2))
                        bad++;
                    if (!(e <= worst))
                        worst = e;
                }
    snprintf(line, sizeof line, "%s: every output row is the constant v row (max error %.3g, %lu bad)", what, worst,
             (unsigned long)bad);
    check_true(bad == 0, line);
}

static void expect_zeros(aec_library *lib, const void *d, size_t n, int f32, const char *what)
{
    size_t i, bad = 0;
    char line[256];
    if (f32) {
        float *h = (float *)malloc(n * 4);
        if (aec_copy_to_host(lib, h, d, n * 4) != AEC_OK) {
            fprintf(stderr, "FAIL downloading %s: %s\n", what, aec_last_error(lib));
            exit(1);
        }
        for (i = 0; i < n; i++)
            bad += h[i] != 0.0f;
        free(h);
    } else {
        float *h = download_bf16(lib, d, n, what);
        for (i = 0; i < n; i++)
            bad += h[i] != 0.0f;
        free(h);
    }
    snprintf(line, sizeof line, "%s: all %lu values are exactly zero (%lu are not)", what, (unsigned long)n,
             (unsigned long)bad);
    check_true(bad == 0, line);
}

#ifdef AEC_HAVE_SOFTMAX_FORWARD
static void softmax_checks(aec_library *lib)
{
    aec_softmax_sizes s;
    aec_softmax_forward_buffers f;
    const int D = AEC_SOFTMAX_DQK, DV = AEC_SOFTMAX_DV;
    printf("section softmax forward\n");
    s.B = 2; s.H = 3; s.Hkv = 3; s.Sq = 70; s.Skv = 301; s.Dqk = D; s.Dv = DV;
    f.q = FAKE; f.k = FAKE; f.v = FAKE; f.o = FAKE; f.row_outputs = (float *)FAKE;
    s.B = 0;
    check_status(lib, aec_softmax_forward(lib, &s, &f, NULL, NULL), AEC_ERROR_SHAPE,
                 "aec_softmax_forward: sizes->B = 0: every size must be at least 1", "softmax B = 0");
    s.B = 2;
    s.Hkv = 1;
    check_status(lib, aec_softmax_forward(lib, &s, &f, NULL, NULL), AEC_ERROR_SHAPE,
                 "sizes->Hkv = 1 must equal sizes->H = 3", "softmax Hkv != H");
    s.Hkv = 3;
    s.Dqk = D + 8;
    check_status(lib, aec_softmax_forward(lib, &s, &f, NULL, NULL), AEC_ERROR_SHAPE, "(aec compile --head-dims)",
                 "softmax head dim the library lacks");
    s.Dqk = D;
    f.q = NULL;
    check_status(lib, aec_softmax_forward(lib, &s, &f, NULL, NULL), AEC_ERROR_ARGUMENT,
                 "aec_softmax_forward: buffers->q is NULL: the input q (bf16 [B=2, H=3, Sq=70, ", "softmax q NULL");
    f.q = FAKE;
    f.row_outputs = NULL;
    check_status(lib, aec_softmax_forward(lib, &s, &f, NULL, NULL), AEC_ERROR_ARGUMENT, "buffers->row_outputs is NULL",
                 "softmax row_outputs NULL");
    f.row_outputs = (float *)FAKE;
    f.k = (const char *)FAKE + 8;
    check_status(lib, aec_softmax_forward(lib, &s, &f, NULL, NULL), AEC_ERROR_ARGUMENT,
                 "aec_softmax_forward: buffers->k = 0x", "softmax k misaligned");
    check_status(lib, aec_softmax_forward(lib, &s, &f, NULL, NULL), AEC_ERROR_ARGUMENT,
                 "is not 16-byte aligned: the kernels access the input k 16 bytes at a time",
                 "softmax k misaligned names the rule");
    f.k = FAKE;
    check_status(lib, aec_softmax_forward(lib, NULL, &f, NULL, NULL), AEC_ERROR_ARGUMENT, "sizes is NULL",
                 "softmax sizes NULL");
    check_status(lib, aec_softmax_forward(lib, &s, NULL, NULL, NULL), AEC_ERROR_ARGUMENT, "buffers is NULL",
                 "softmax buffers NULL");
    if (!on_gpu) {
        check_status(lib, aec_softmax_forward(lib, &s, &f, NULL, NULL), AEC_ERROR_ARGUMENT, "is not open",
                     "softmax on a library that is not open");
        check_true(aec_softmax_forward_workspace_bytes(lib, &s) == AEC_WORKSPACE_INVALID,
                   "softmax workspace_bytes of a library that is not open is AEC_WORKSPACE_INVALID");
        check_true(aec_softmax_forward_kernel(lib, &s) == NULL,
                   "softmax kernel of a library that is not open is NULL");
        return;
    }
    {
        /* Constant v rows: the output is that row, whatever the scores. */
        size_t nq = (size_t)s.B * s.H * s.Sq * D, nk = (size_t)s.B * s.Hkv * s.Skv * D;
        size_t no = (size_t)s.B * s.H * s.Sq * DV;
        uint16_t *q = check_random_bf16(nq, 1), *k = check_random_bf16(nk, 2);
        uint16_t *u = check_random_bf16((size_t)s.B * s.Hkv * DV, 3);
        uint16_t *v = constant_v(u, s.B, s.Hkv, s.Skv, DV);
        size_t ws = aec_softmax_forward_workspace_bytes(lib, &s);
        float *o;
        check_true(ws != AEC_WORKSPACE_INVALID, "softmax workspace_bytes is valid");
        check_true(aec_softmax_forward_kernel(lib, &s) != NULL &&
                       strncmp(aec_softmax_forward_kernel(lib, &s), "aec_fwd_softmax_", 16) == 0,
                   "softmax forward names its kernel");
        f.q = check_upload(lib, q, nq * 2, "q");
        f.k = check_upload(lib, k, nk * 2, "k");
        f.v = check_upload(lib, v, (size_t)s.B * s.Hkv * s.Skv * DV * 2, "v");
        f.o = nan_bf16(lib, no, "o");
        f.row_outputs = (float *)check_upload(lib, NULL, (size_t)4 * s.B * s.H * s.Sq * 4, "row_outputs");
        check_status(lib, aec_softmax_forward(lib, &s, &f, NULL, NULL), AEC_OK, NULL, "softmax forward runs");
        check_status(lib, aec_synchronize(lib), AEC_OK, NULL, "softmax forward completes");
        o = download_bf16(lib, f.o, no, "o");
        expect_rows_of_u(o, u, s.B, s.H, s.Hkv, s.Sq, DV, "softmax forward");
#ifdef AEC_HAVE_SOFTMAX_BACKWARD
        {
            /* dO = 0: every gradient is zero (and written: dq, dk, dv start as NaN). */
            aec_softmax_backward_buffers g;
            size_t wsb = aec_softmax_backward_workspace_bytes(lib, &s);
            void *w = NULL;
            printf("section softmax backward\n");
            check_true(wsb != AEC_WORKSPACE_INVALID && wsb > 0, "softmax backward needs a workspace");
            g.q = f.q; g.k = f.k; g.v = f.v; g.o = f.o; g.row_outputs = f.row_outputs;
            g.dout = check_upload(lib, NULL, no * 2, "dout");
            g.dq = nan_bf16(lib, nq, "dq");
            g.dk = nan_bf16(lib, nk, "dk");
            g.dv = nan_bf16(lib, (size_t)s.B * s.Hkv * s.Skv * DV, "dv");
            w = check_upload(lib, NULL, wsb, "workspace");
            check_status(lib, aec_softmax_backward(lib, &s, &g, (char *)w + 16, NULL), AEC_ERROR_ARGUMENT,
                         "is not 256-byte aligned", "softmax backward with a misaligned workspace");
            check_status(lib, aec_softmax_backward(lib, &s, &g, w, NULL), AEC_OK, NULL,
                         "softmax backward runs with a given workspace");
            check_status(lib, aec_synchronize(lib), AEC_OK, NULL, "softmax backward completes");
            expect_zeros(lib, g.dq, nq, 0, "softmax dq for dO = 0");
            expect_zeros(lib, g.dk, nk, 0, "softmax dk for dO = 0");
            check_status(lib, aec_softmax_backward(lib, &s, &g, NULL, NULL), AEC_OK, NULL,
                         "softmax backward runs with its own workspace");
            check_status(lib, aec_synchronize(lib), AEC_OK, NULL, "softmax backward completes again");
            expect_zeros(lib, g.dv, (size_t)s.B * s.Hkv * s.Skv * DV, 0, "softmax dv for dO = 0");
            aec_device_free(lib, w);
            aec_device_free(lib, (void *)g.dout);
            aec_device_free(lib, g.dq);
            aec_device_free(lib, g.dk);
            aec_device_free(lib, g.dv);
        }
#endif
        aec_device_free(lib, (void *)f.q);
        aec_device_free(lib, (void *)f.k);
        aec_device_free(lib, (void *)f.v);
        aec_device_free(lib, f.o);
        aec_device_free(lib, f.row_outputs);
        free(q); free(k); free(u); free(v); free(o);
    }
}
#endif

#ifdef AEC_HAVE_SOFTMAX_BACKWARD
static void softmax_backward_checks(aec_library *lib)
{
    aec_softmax_sizes s;
    aec_softmax_backward_buffers g;
    if (!on_gpu)
        printf("section softmax backward\n");
    s.B = 1; s.H = 2; s.Hkv = 2; s.Sq = 5; s.Skv = 7; s.Dqk = AEC_SOFTMAX_DQK; s.Dv = AEC_SOFTMAX_DV;
    g.q = FAKE; g.k = FAKE; g.v = FAKE; g.o = FAKE; g.row_outputs = (const float *)FAKE; g.dout = NULL;
    g.dq = FAKE; g.dk = FAKE; g.dv = FAKE;
    check_status(lib, aec_softmax_backward(lib, &s, &g, NULL, NULL), AEC_ERROR_ARGUMENT,
                 "buffers->dout is NULL: the input dout", "softmax backward dout NULL");
    g.dout = FAKE;
    g.dk = NULL;
    check_status(lib, aec_softmax_backward(lib, &s, &g, NULL, NULL), AEC_ERROR_ARGUMENT,
                 "buffers->dk is NULL: the output dk (bf16 [B=1, Hkv=2, Skv=7, ", "softmax backward dk NULL");
}
#endif

#ifdef AEC_HAVE_ALIBI_FORWARD
static void alibi_checks(aec_library *lib)
{
    aec_alibi_sizes s;
    aec_alibi_forward_buffers f;
    const int D = AEC_ALIBI_DQK, DV = AEC_ALIBI_DV;
    printf("section alibi forward\n");
    s.B = 1; s.H = 4; s.Hkv = 4; s.Sq = 33; s.Skv = 129; s.Dqk = D; s.Dv = DV;
    f.q = FAKE; f.k = FAKE; f.v = FAKE; f.slopes = NULL; f.o = FAKE; f.row_outputs = (float *)FAKE;
    check_status(lib, aec_alibi_forward(lib, &s, &f, NULL, NULL), AEC_ERROR_ARGUMENT,
                 "buffers->slopes is NULL: the input slopes (f32 [H=4]) is required", "alibi slopes NULL");
    if (!on_gpu)
        return;
    {
        size_t nq = (size_t)s.B * s.H * s.Sq * D, nk = (size_t)s.B * s.Hkv * s.Skv * D;
        size_t no = (size_t)s.B * s.H * s.Sq * DV;
        float slopes[4] = {0.5f, 0.25f, 0.125f, 0.0625f};
        uint16_t *q = check_random_bf16(nq, 4), *k = check_random_bf16(nk, 5);
        uint16_t *u = check_random_bf16((size_t)s.B * s.Hkv * DV, 6);
        uint16_t *v = constant_v(u, s.B, s.Hkv, s.Skv, DV);
        float *o;
        f.q = check_upload(lib, q, nq * 2, "q");
        f.k = check_upload(lib, k, nk * 2, "k");
        f.v = check_upload(lib, v, (size_t)s.B * s.Hkv * s.Skv * DV * 2, "v");
        f.slopes = (const float *)check_upload(lib, slopes, sizeof slopes, "slopes");
        f.o = nan_bf16(lib, no, "o");
        f.row_outputs = (float *)check_upload(lib, NULL, (size_t)4 * s.B * s.H * s.Sq * 4, "row_outputs");
        check_status(lib, aec_alibi_forward(lib, &s, &f, NULL, NULL), AEC_OK, NULL, "alibi forward runs");
        check_status(lib, aec_synchronize(lib), AEC_OK, NULL, "alibi forward completes");
        o = download_bf16(lib, f.o, no, "o");
        expect_rows_of_u(o, u, s.B, s.H, s.Hkv, s.Sq, DV, "alibi forward");
        aec_device_free(lib, (void *)f.q);
        aec_device_free(lib, (void *)f.k);
        aec_device_free(lib, (void *)f.v);
        aec_device_free(lib, (void *)f.slopes);
        aec_device_free(lib, f.o);
        aec_device_free(lib, f.row_outputs);
        free(q); free(k); free(u); free(v); free(o);
    }
}
#endif

#ifdef AEC_HAVE_DECODE_FORWARD
static void decode_checks(aec_library *lib)
{
    aec_decode_sizes s;
    aec_decode_forward_buffers f;
    const int D = AEC_DECODE_DQK, DV = AEC_DECODE_DV;
    printf("section decode forward\n");
    /* Few query rows, many keys: the KV-split path with its workspace. */
    s.B = 2; s.H = 8; s.Hkv = 2; s.Sq = 1; s.Skv = 4099; s.Dqk = D; s.Dv = DV;
    f.q = FAKE; f.k = FAKE; f.v = FAKE; f.o = FAKE; f.row_outputs = (float *)FAKE;
    s.Sq = 2;
    check_status(lib, aec_decode_forward(lib, &s, &f, NULL, NULL), AEC_ERROR_SHAPE,
                 "aec_decode_forward: sizes->Sq = 2, but Decode fixes Sq = 1", "decode Sq fixed");
    s.Sq = 1;
    s.Hkv = 3;
    check_status(lib, aec_decode_forward(lib, &s, &f, NULL, NULL), AEC_ERROR_SHAPE,
                 "sizes->H = 8 must be a multiple of sizes->Hkv = 3", "decode H multiple of Hkv");
    s.Hkv = 2;
    s.Skv = -4;
    check_status(lib, aec_decode_forward(lib, &s, &f, NULL, NULL), AEC_ERROR_SHAPE, "sizes->Skv = -4",
                 "decode negative Skv");
    s.Skv = 4099;
    if (!on_gpu) {
        check_status(lib, aec_decode_forward(lib, &s, &f, NULL, NULL), AEC_ERROR_ARGUMENT, "is not open",
                     "decode on a library that is not open");
        return;
    }
    {
        size_t nq = (size_t)s.B * s.H * D, nk = (size_t)s.B * s.Hkv * s.Skv * D, no = (size_t)s.B * s.H * DV;
        uint16_t *q = check_random_bf16(nq, 7), *k = check_random_bf16(nk, 8);
        uint16_t *u = check_random_bf16((size_t)s.B * s.Hkv * DV, 9);
        uint16_t *v = constant_v(u, s.B, s.Hkv, s.Skv, DV);
        size_t ws = aec_decode_forward_workspace_bytes(lib, &s);
        void *w;
        float *o;
        check_true(ws != AEC_WORKSPACE_INVALID && ws > 0, "decode with 4099 keys and 32 rows splits KV (a workspace)");
        printf("     decode workspace: %lu bytes\n", (unsigned long)ws);
        f.q = check_upload(lib, q, nq * 2, "q");
        f.k = check_upload(lib, k, nk * 2, "k");
        f.v = check_upload(lib, v, (size_t)s.B * s.Hkv * s.Skv * DV * 2, "v");
        f.o = nan_bf16(lib, no, "o");
        f.row_outputs = (float *)check_upload(lib, NULL, (size_t)4 * s.B * s.H * 4, "row_outputs");
        w = check_upload(lib, NULL, ws, "workspace");
        check_status(lib, aec_decode_forward(lib, &s, &f, w, NULL), AEC_OK, NULL, "decode forward runs (given workspace)");
        check_status(lib, aec_synchronize(lib), AEC_OK, NULL, "decode forward completes");
        o = download_bf16(lib, f.o, no, "o");
        expect_rows_of_u(o, u, s.B, s.H, s.Hkv, 1, DV, "decode forward, split KV");
        free(o);
        aec_device_free(lib, f.o);
        f.o = nan_bf16(lib, no, "o");
        check_status(lib, aec_decode_forward(lib, &s, &f, NULL, NULL), AEC_OK, NULL, "decode forward runs (own workspace)");
        check_status(lib, aec_synchronize(lib), AEC_OK, NULL, "decode forward completes again");
        o = download_bf16(lib, f.o, no, "o");
        expect_rows_of_u(o, u, s.B, s.H, s.Hkv, 1, DV, "decode forward, split KV, own workspace");
        aec_device_free(lib, w);
        aec_device_free(lib, (void *)f.q);
        aec_device_free(lib, (void *)f.k);
        aec_device_free(lib, (void *)f.v);
        aec_device_free(lib, f.o);
        aec_device_free(lib, f.row_outputs);
        free(q); free(k); free(u); free(v); free(o);
    }
}
#endif

#ifdef AEC_HAVE_MAMBA2_FORWARD
static void mamba2_checks(aec_library *lib)
{
    aec_mamba2_sizes s;
    aec_mamba2_forward_buffers f;
    const int DK = AEC_MAMBA2_DK, DV = AEC_MAMBA2_DV;
    printf("section mamba2 forward\n");
    s.B = 2; s.H = 3; s.S = 150; s.Dk = DK; s.Dv = DV;
    f.q = FAKE; f.k = FAKE; f.v = FAKE; f.a = (const float *)FAKE; f.dt = (const float *)FAKE; f.o = FAKE;
    f.state_in = NULL; f.state_out = NULL;
    f.dt = NULL;
    check_status(lib, aec_mamba2_forward(lib, &s, &f, NULL, NULL), AEC_ERROR_ARGUMENT,
                 "buffers->dt is NULL: the input dt (f32 [B=2, H=3, S=150]) is required", "mamba2 dt NULL");
    f.dt = (const float *)FAKE;
    s.Dv = DV * 2;
    check_status(lib, aec_mamba2_forward(lib, &s, &f, NULL, NULL), AEC_ERROR_SHAPE, "sizes->Dk = ",
                 "mamba2 head dims the library lacks");
    s.Dv = DV;
    if (!on_gpu) {
        /* The optional state pointers may be NULL: the checks pass. */
        check_status(lib, aec_mamba2_forward(lib, &s, &f, NULL, NULL), AEC_ERROR_ARGUMENT, "is not open",
                     "mamba2 without the optional states on a library that is not open");
        return;
    }
    {
        size_t nq = (size_t)s.B * s.H * s.S * DK, nv = (size_t)s.B * s.H * s.S * DV;
        size_t nstate = (size_t)s.B * s.H * DK * DV;
        uint16_t *q = check_random_bf16(nq, 10), *k = check_random_bf16(nq, 11);
        float *a = (float *)malloc((size_t)s.H * 4), *dt = (float *)malloc((size_t)s.B * s.H * s.S * 4);
        size_t i;
        float *nan_state = (float *)malloc(nstate * 4);
        for (i = 0; i < (size_t)s.H; i++)
            a[i] = -0.5f;
        for (i = 0; i < (size_t)s.B * s.H * s.S; i++)
            dt[i] = 0.1f;
        for (i = 0; i < nstate; i++)
            nan_state[i] = NAN;
        f.q = check_upload(lib, q, nq * 2, "q");
        f.k = check_upload(lib, k, nq * 2, "k");
        f.v = check_upload(lib, NULL, nv * 2, "v");
        f.a = (const float *)check_upload(lib, a, (size_t)s.H * 4, "a");
        f.dt = (const float *)check_upload(lib, dt, (size_t)s.B * s.H * s.S * 4, "dt");
        f.o = nan_bf16(lib, nv, "o");
        f.state_out = (float *)check_upload(lib, nan_state, nstate * 4, "state_out");
        check_status(lib, aec_mamba2_forward(lib, &s, &f, NULL, NULL), AEC_OK, NULL,
                     "mamba2 forward runs (no initial state)");
        check_status(lib, aec_synchronize(lib), AEC_OK, NULL, "mamba2 forward completes");
        expect_zeros(lib, f.o, nv, 0, "mamba2 output for v = 0");
        expect_zeros(lib, f.state_out, nstate, 1, "mamba2 final state for v = 0");
        aec_device_free(lib, (void *)f.q);
        aec_device_free(lib, (void *)f.k);
        aec_device_free(lib, (void *)f.v);
        aec_device_free(lib, (void *)f.a);
        aec_device_free(lib, (void *)f.dt);
        aec_device_free(lib, f.o);
        aec_device_free(lib, f.state_out);
        free(q); free(k); free(a); free(dt); free(nan_state);
    }
}
#endif

#ifdef AEC_HAVE_MAMBA2_BACKWARD
static size_t align256(size_t n)
{
    return (n + 255) / 256 * 256;
}

static void mamba2_backward_checks(aec_library *lib)
{
    aec_mamba2_sizes s;
    aec_mamba2_backward_buffers g;
    const int DK = AEC_MAMBA2_DK, DV = AEC_MAMBA2_DV;
    printf("section mamba2 backward\n");
    s.B = 2; s.H = 3; s.S = 150; s.Dk = DK; s.Dv = DV;
    g.q = FAKE; g.k = FAKE; g.v = FAKE; g.a = (const float *)FAKE; g.dt = (const float *)FAKE;
    g.do_ = NULL; g.state_in = NULL; g.d_state_out = NULL;
    g.dq = FAKE; g.dk = FAKE; g.dv = FAKE; g.da = (float *)FAKE; g.ddt = (float *)FAKE; g.d_state_in = NULL;
    check_status(lib, aec_mamba2_backward(lib, &s, &g, NULL, NULL), AEC_ERROR_ARGUMENT,
                 "buffers->do_ is NULL: the input do (bf16 [B=2, H=3, S=150, 64]) is required", "mamba2 backward do NULL");
    g.do_ = FAKE;
    g.ddt = NULL;
    check_status(lib, aec_mamba2_backward(lib, &s, &g, NULL, NULL), AEC_ERROR_ARGUMENT,
                 "buffers->ddt is NULL: the output ddt (f32 [B=2, H=3, S=150]) is required", "mamba2 backward ddt NULL");
    g.ddt = (float *)FAKE;
    s.S = 0;
    check_status(lib, aec_mamba2_backward(lib, &s, &g, NULL, NULL), AEC_ERROR_SHAPE,
                 "sizes->S = 0: every size must be at least 1", "mamba2 backward S = 0");
    s.S = 150;
    if (!on_gpu) {
        /* The optional state pointers may be NULL: the checks pass. */
        check_status(lib, aec_mamba2_backward(lib, &s, &g, NULL, NULL), AEC_ERROR_ARGUMENT, "is not open",
                     "mamba2 backward without the optional states on a library that is not open");
        return;
    }
    {
        size_t nq = (size_t)s.B * s.H * s.S * DK, nv = (size_t)s.B * s.H * s.S * DV;
        size_t rows = (size_t)s.B * s.H * s.S, nstate = (size_t)s.B * s.H * DK * DV;
        size_t chunks = ((size_t)s.S + 63) / 64, per_chunk = (size_t)s.B * s.H * chunks * DK * DV * 2;
        uint16_t *q = check_random_bf16(nq, 20), *k = check_random_bf16(nq, 21), *v = check_random_bf16(nv, 22);
        float *a = (float *)malloc((size_t)s.H * 4), *dt = (float *)malloc(rows * 4);
        size_t i;
        /* states and dstates (bf16, per chunk), dlog (f32, per step). */
        check_true(aec_mamba2_backward_workspace_bytes(lib, &s) == 2 * align256(per_chunk) + align256(rows * 4),
                   "mamba2 backward workspace: states, dstates and dlog");
        for (i = 0; i < (size_t)s.H; i++)
            a[i] = -0.5f;
        for (i = 0; i < rows; i++)
            dt[i] = 0.1f;
        g.q = check_upload(lib, q, nq * 2, "q");
        g.k = check_upload(lib, k, nq * 2, "k");
        g.v = check_upload(lib, v, nv * 2, "v");
        g.a = (const float *)check_upload(lib, a, (size_t)s.H * 4, "a");
        g.dt = (const float *)check_upload(lib, dt, rows * 4, "dt");
        g.do_ = check_upload(lib, NULL, nv * 2, "do (zeros)");
        g.dq = nan_bf16(lib, nq, "dq");
        g.dk = nan_bf16(lib, nq, "dk");
        g.dv = nan_bf16(lib, nv, "dv");
        g.da = (float *)nan_bf16(lib, (size_t)s.H * 2, "da");
        g.ddt = (float *)nan_bf16(lib, rows * 2, "ddt");
        g.d_state_in = (float *)nan_bf16(lib, nstate * 2, "d_state_in");
        check_status(lib, aec_mamba2_backward(lib, &s, &g, NULL, NULL), AEC_OK, NULL,
                     "mamba2 backward runs (zero output gradient)");
        check_status(lib, aec_synchronize(lib), AEC_OK, NULL, "mamba2 backward completes");
        expect_zeros(lib, g.dq, nq, 0, "mamba2 dq for dO = 0");
        expect_zeros(lib, g.dk, nq, 0, "mamba2 dk for dO = 0");
        expect_zeros(lib, g.dv, nv, 0, "mamba2 dv for dO = 0");
        expect_zeros(lib, g.da, (size_t)s.H, 1, "mamba2 da for dO = 0");
        expect_zeros(lib, g.ddt, rows, 1, "mamba2 ddt for dO = 0");
        expect_zeros(lib, g.d_state_in, nstate, 1, "mamba2 d_state_in for dO = 0");
        aec_device_free(lib, (void *)g.q);
        aec_device_free(lib, (void *)g.k);
        aec_device_free(lib, (void *)g.v);
        aec_device_free(lib, (void *)g.a);
        aec_device_free(lib, (void *)g.dt);
        aec_device_free(lib, (void *)g.do_);
        aec_device_free(lib, g.dq);
        aec_device_free(lib, g.dk);
        aec_device_free(lib, g.dv);
        aec_device_free(lib, g.da);
        aec_device_free(lib, g.ddt);
        aec_device_free(lib, g.d_state_in);
        free(q); free(k); free(v); free(a); free(dt);
    }
}
#endif

/* The loader's KV-split rule: the cases of KvSplitPlan::splits' test
   (compiler/src/launch_plan.rs) and the Python module's. */
static void kv_split_rule_checks(void)
{
    const int h100 = 228 * 1024;
    check_true(aecl_kv_splits(264, 100, 128, 0, 0, 0, 132, 0, 0) == 1, "kv splits: 264 blocks, none");
    check_true(aecl_kv_splits(8, 256, 128, 0, 0, 0, 132, 0, 0) == 32, "kv splits: 8 blocks of 256 key blocks, 32");
    check_true(aecl_kv_splits(8, 8, 128, 0, 0, 0, 132, 0, 0) == 2, "kv splits: 8 key blocks, 2");
    check_true(aecl_kv_splits(1, 100000, 128, 0, 0, 0, 132, 0, 0) == 128, "kv splits: at most max_splits");
    check_true(aecl_kv_splits(128, 128, 128, 93440, 0, 0, 132, h100, 0) == 2, "kv splits: 93 KB blocks, one wave");
    check_true(aecl_kv_splits(128, 128, 128, 93440, 0, 0, 132, 0, 0) == 2, "kv splits: 93 KB blocks, no cap");
    check_true(aecl_kv_splits(32, 128, 128, 0, 0, 0, 132, 0, 0) == 8, "kv splits: 32 blocks, two on every SM");
    check_true(aecl_kv_splits(32, 128, 128, 0, 0, 0, 132, h100, 2) == 8, "kv splits: 32 blocks, two resident");
    check_true(aecl_kv_splits(32, 128, 128, 0, 0, 0, 132, h100, 1) == 4, "kv splits: 32 blocks, one resident");
    check_true(aecl_kv_splits(140, 128, 128, 0, 0, 0, 132, 0, 2) == 1, "kv splits: 140 blocks, two resident");
    check_true(aecl_kv_splits(140, 128, 128, 0, 0, 0, 132, 0, 3) == 2, "kv splits: 140 blocks, three resident");
    /* 16 KiB in flight per block, six resident (the H200 sweep's decoding
       tile): B32 x 4096 takes 2 splits, B8 x 16384 8, B4 x 32768 16. */
    check_true(aecl_kv_splits(256, 128, 128, 36864, 16384, 1792, 132, 0, 6) == 2, "kv splits: 256 blocks of 16 KiB, 2");
    check_true(aecl_kv_splits(64, 512, 128, 36864, 16384, 1792, 132, 0, 6) == 8, "kv splits: 64 blocks of 16 KiB, 8");
    check_true(aecl_kv_splits(32, 1024, 128, 36864, 16384, 1792, 132, 0, 6) == 16, "kv splits: 32 blocks of 16 KiB, 16");
    check_true(aecl_split_cost(256, 128, 1, 132, 1, 6, 16384, 0) == 2 * 129 * 1104, "split cost: two of 16 KiB, 8% slower");
    check_true(aecl_split_cost(256, 128, 2, 132, 1, 6, 16384, 0) == 4 * 65 * 1024, "split cost: four of 16 KiB");
}

static void all_sections(aec_library *lib)
{
#ifdef AEC_HAVE_SOFTMAX_FORWARD
    softmax_checks(lib);
#endif
#ifdef AEC_HAVE_SOFTMAX_BACKWARD
    softmax_backward_checks(lib);
#endif
#ifdef AEC_HAVE_ALIBI_FORWARD
    alibi_checks(lib);
#endif
#ifdef AEC_HAVE_DECODE_FORWARD
    decode_checks(lib);
#endif
#ifdef AEC_HAVE_MAMBA2_FORWARD
    mamba2_checks(lib);
#endif
#ifdef AEC_HAVE_MAMBA2_BACKWARD
    mamba2_backward_checks(lib);
#endif
    (void)lib;
}

int main(int argc, char **argv)
{
    aec_library lib;
    int st;
    void *p = NULL;
    if (argc != 2) {
        fprintf(stderr, "usage: %s LIBDIR\n", argv[0]);
        return 2;
    }
    st = aec_library_open(&lib, "/nonexistent/aec-library");
    check_status(&lib, st, AEC_ERROR_FILE, "/nonexistent/aec-library/manifest.json", "open a directory without a library");
    check_status(&lib, aec_device_alloc(&lib, 64, &p), AEC_ERROR_ARGUMENT, "is not open", "aec_device_alloc before open");
    check_true(p == NULL, "aec_device_alloc leaves the pointer NULL on failure");
    aec_library_close(&lib);
    aec_library_close(&lib); /* twice: harmless */
    kv_split_rule_checks();
    /* The checks before the driver, on the closed library. */
    all_sections(&lib);

    st = aec_library_open(&lib, argv[1]);
    if (st != AEC_OK) {
        int code = st == AEC_ERROR_NO_DRIVER ? 3 : 4;
        if (st != AEC_ERROR_NO_DRIVER && st != AEC_ERROR_DRIVER) {
            fprintf(stderr, "FAIL aec_library_open(%s): %s: %s\n", argv[1], aec_status_name(st), aec_last_error(&lib));
            return 1;
        }
        fprintf(stderr, "%s\n", aec_last_error(&lib));
        aec_library_close(&lib);
        printf("%d check(s) failed; the library did not open (%s)\n", check_failures, aec_status_name(st));
        return check_failures ? 1 : code;
    }
    printf("opened %s on %s (compute capability %d.%d, builds %s, %d SMs)\n", argv[1], lib.device_name, lib.cc_major,
           lib.cc_minor, lib.arch, lib.sm_count);
    check_true(lib.sm_count > 0 && lib.arch[0] != '\0', "the library knows the GPU's arch and SM count");
    on_gpu = 1;
    all_sections(&lib);
    aec_library_close(&lib);
    printf("%d check(s) failed\n", check_failures);
    return check_failures ? 1 : 0;
}
