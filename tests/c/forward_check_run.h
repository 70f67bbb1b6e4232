/* The body of forward_check for one variant, included once per variant
   with FC_VARIANT set (softmax, decode): the same q, k, v, o, row_outputs
   buffers and sizes fields, other types and entry points. */
#define FC_CAT3(a, b, c) a##b##c
#define FC_XCAT3(a, b, c) FC_CAT3(a, b, c)
#define FC_SIZES FC_XCAT3(aec_, FC_VARIANT, _sizes)
#define FC_BUFFERS FC_XCAT3(aec_, FC_VARIANT, _forward_buffers)
#define FC_FORWARD FC_XCAT3(aec_, FC_VARIANT, _forward)
#define FC_WORKSPACE FC_XCAT3(aec_, FC_VARIANT, _forward_workspace_bytes)
#define FC_KERNEL FC_XCAT3(aec_, FC_VARIANT, _forward_kernel)
#define FC_RUN FC_XCAT3(fc_run_, FC_VARIANT, )

static int FC_RUN(aec_library *lib, const fc_args *a)
{
    FC_SIZES s;
    FC_BUFFERS f;
    size_t ws, i;
    void *w = NULL;
    int pass, failed = 0;
    double worst_o = 0.0, worst_rows = 0.0;
    s.B = a->B; s.H = a->H; s.Hkv = a->Hkv; s.Sq = a->Sq; s.Skv = a->Skv; s.Dqk = a->Dqk; s.Dv = a->Dv;
    f.q = check_upload(lib, a->q, a->nq * 2, "q");
    f.k = check_upload(lib, a->k, a->nk * 2, "k");
    f.v = check_upload(lib, a->v, a->nv * 2, "v");
    f.o = check_upload(lib, NULL, a->no * 2, "o");
    /* Room for the plan's row outputs (at most 8 per row here). */
    f.row_outputs = (float *)check_upload(lib, NULL, 8 * a->nrows_each * 4, "row_outputs");

    /* The error path on the GPU: nothing launches, the status names it. */
    s.Dqk += 1;
    check_status(lib, FC_FORWARD(lib, &s, &f, NULL, NULL), AEC_ERROR_SHAPE, "sizes->Dqk = ",
                 "a head dim the library lacks");
    s.Dqk -= 1;
    s.Hkv = s.H + 1;
    check_status(lib, FC_FORWARD(lib, &s, &f, NULL, NULL), AEC_ERROR_SHAPE, "sizes->Hkv = ", "a wrong Hkv");
    s.Hkv = a->Hkv;
    {
        const void *keep = f.k;
        f.k = NULL;
        check_status(lib, FC_FORWARD(lib, &s, &f, NULL, NULL), AEC_ERROR_ARGUMENT, "buffers->k is NULL: the input k",
                     "k NULL");
        f.k = keep;
    }
#ifdef FC_GRID_LIMITS
    /* Sizes past the launch limits (grid z = B): refused before any launch.
       (Only where the grid grows with B: a persistent kernel, the softmax
       forward on sm_90a, launches min(units, SMs) blocks whatever B is, and
       would run with these small buffers.) */
    s.B = 70000;
    check_status(lib, FC_FORWARD(lib, &s, &f, NULL, NULL), AEC_ERROR_SHAPE, "CUDA and HIP allow x in [1, 2^31 - 1]",
                 "a grid over the launch limits");
    s.B = a->B;
#endif
    check_status(lib, aec_synchronize(lib), AEC_OK, NULL, "no launch went wrong so far");

    ws = FC_WORKSPACE(lib, &s);
    check_true(ws != AEC_WORKSPACE_INVALID, "workspace_bytes is valid");
    if (ws > 0 && ws != AEC_WORKSPACE_INVALID)
        w = check_upload(lib, NULL, ws, "workspace");
    /* With a workspace given, then (when there is one) allocated by the call. */
    for (pass = 0; pass < (w != NULL ? 2 : 1); pass++) {
        double e_o, e_rows = 0.0;
        uint16_t *o_bits = (uint16_t *)malloc(a->no * 2);
        float *o = (float *)malloc(a->no * sizeof *o);
        float *rows = (float *)malloc((a->n_rows ? (size_t)a->n_rows : 1) * a->nrows_each * 4);
        /* o starts as NaN: each run must write all of it. */
        {
            uint16_t *nan = (uint16_t *)malloc(a->no * 2);
            for (i = 0; nan != NULL && i < a->no; i++)
                nan[i] = 0x7fc0u;
            if (nan == NULL || aec_copy_to_device(lib, f.o, nan, a->no * 2) != AEC_OK)
                failed = 1;
            free(nan);
        }
        check_status(lib, FC_FORWARD(lib, &s, &f, pass == 0 ? w : NULL, NULL), AEC_OK, NULL,
                     pass == 0 ? "the forward runs" : "the forward runs with its own workspace");
        check_status(lib, aec_synchronize(lib), AEC_OK, NULL, "the forward completes");
        if (o_bits == NULL || o == NULL || rows == NULL || aec_copy_to_host(lib, o_bits, f.o, a->no * 2) != AEC_OK ||
            (a->n_rows && aec_copy_to_host(lib, rows, f.row_outputs, (size_t)a->n_rows * a->nrows_each * 4) != AEC_OK)) {
            fprintf(stderr, "FAIL reading the outputs back: %s\n", aec_last_error(lib));
            exit(1);
        }
        for (i = 0; i < a->no; i++)
            o[i] = check_from_bf16(o_bits[i]);
        e_o = fc_scaled_error(o, a->o_ref, a->no);
        for (i = 0; i < (size_t)a->n_rows; i++) {
            double e = fc_scaled_error(rows + i * a->nrows_each, a->rows_ref + i * a->nrows_each, a->nrows_each);
            printf("     pass %d row output %lu: error %.6g\n", pass, (unsigned long)i, e);
            if (!(e <= e_rows))
                e_rows = e;
        }
        if (!(e_o <= worst_o))
            worst_o = e_o;
        if (!(e_rows <= worst_rows))
            worst_rows = e_rows;
        free(o_bits);
        free(o);
        free(rows);
    }
    printf("RESULT o=%.6g rows=%.6g workspace=%lu runs=%d tol=%g kernel=%s\n", worst_o, worst_rows, (unsigned long)ws,
           w != NULL ? 2 : 1, a->tol, FC_KERNEL(lib, &s) ? FC_KERNEL(lib, &s) : "(none)");
    if (!(worst_o <= a->tol) || !(worst_rows <= a->tol)) {
        fprintf(stderr, "FAIL error above the tolerance %g: o %.6g, rows %.6g\n", a->tol, worst_o, worst_rows);
        failed = 1;
    }
    aec_device_free(lib, w);
    aec_device_free(lib, (void *)f.q);
    aec_device_free(lib, (void *)f.k);
    aec_device_free(lib, (void *)f.v);
    aec_device_free(lib, f.o);
    aec_device_free(lib, f.row_outputs);
    return failed;
}

#undef FC_SIZES
#undef FC_BUFFERS
#undef FC_FORWARD
#undef FC_WORKSPACE
#undef FC_KERNEL
#undef FC_RUN
