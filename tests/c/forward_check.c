/*
 * forward_check: runs a library's forward through the generated C interface
 * on the GPU and compares it with a reference (written by
 * bench/library_c_check.sh from PyTorch in float64).
 *
 *   forward_check LIBDIR VARIANT.forward B H Hkv Sq Skv Dqk Dv Q K V O_REF ROWS_REF TOL
 *
 * VARIANT: softmax (examples/softmax.rs: Hkv = H) or decode
 * (examples/decode.rs: Sq = 1, H a multiple of Hkv, split KV), where the
 * library has it. Q, K, V: raw bf16 (little-endian) [B, H|Hkv, S, D] files;
 * O_REF: raw f32 [B, H, Sq, Dv]; ROWS_REF: raw f32 [n, B, H, Sq], the first
 * n row outputs of the plan in its order, or "-" for none. The error of a
 * tensor is max |got - ref| / max |ref| (its largest error against its
 * scale). With a workspace the forward runs twice (workspace given; NULL,
 * allocated by the call), each from an output filled with NaN. The program
 * prints `RESULT o=<err> rows=<err> ...` and exits 1 when an error exceeds
 * TOL or the GPU's error path misbehaves (a wrong size must return
 * AEC_ERROR_SHAPE naming it, a NULL input AEC_ERROR_ARGUMENT naming it,
 * before launching anything). Exit 2: bad usage or unreadable files; 4: the
 * library did not open.
 */
#include "check_util.h"

typedef struct fc_args {
    int B, H, Hkv, Sq, Skv, Dqk, Dv, n_rows;
    size_t nq, nk, nv, no, nrows_each;
    const uint16_t *q, *k, *v;
    const float *o_ref, *rows_ref;
    double tol;
} fc_args;

static inline void *fc_read_all(const char *path, size_t bytes)
{
    FILE *f = fopen(path, "rb");
    void *buf = malloc(bytes ? bytes : 1);
    if (f == NULL || buf == NULL || fread(buf, 1, bytes, f) != bytes || fgetc(f) != EOF) {
        fprintf(stderr, "forward_check: %s: cannot read exactly %lu bytes\n", path, (unsigned long)bytes);
        exit(2);
    }
    fclose(f);
    return buf;
}

static inline int fc_parse(const char *s, const char *what)
{
    char *end = NULL;
    long v = strtol(s, &end, 10);
    if (end == s || *end != '\0' || v < 1 || v > 2147483647L) {
        fprintf(stderr, "forward_check: %s = `%s` is not a positive int\n", what, s);
        exit(2);
    }
    return (int)v;
}

/* max |got - ref| / max |ref|; a NaN or infinity in got counts as infinite. */
static inline double fc_scaled_error(const float *got, const float *ref, size_t n)
{
    double worst = 0.0, scale = 0.0;
    size_t i;
    for (i = 0; i < n; i++) {
        double e = fabs((double)got[i] - (double)ref[i]);
        if (!(e == e) || isinf(got[i]))
            return INFINITY;
        if (e > worst)
            worst = e;
        if (fabs((double)ref[i]) > scale)
            scale = fabs((double)ref[i]);
    }
    return scale > 0.0 ? worst / scale : worst;
}

#ifdef AEC_HAVE_SOFTMAX_FORWARD
#define FC_VARIANT softmax
#include "forward_check_run.h"
#undef FC_VARIANT
#endif
#ifdef AEC_HAVE_DECODE_FORWARD
#define FC_VARIANT decode
#define FC_GRID_LIMITS /* split-KV decode: grid (x, Hkv, B) */
#include "forward_check_run.h"
#undef FC_GRID_LIMITS
#undef FC_VARIANT
#endif

int main(int argc, char **argv)
{
    aec_library lib;
    fc_args a;
    int st, failed = -1;
    const char *which;
    if (argc != 16) {
        fprintf(stderr, "usage: %s LIBDIR VARIANT.forward B H Hkv Sq Skv Dqk Dv Q K V O_REF ROWS_REF|- TOL\n", argv[0]);
        return 2;
    }
    which = argv[2];
    a.B = fc_parse(argv[3], "B");
    a.H = fc_parse(argv[4], "H");
    a.Hkv = fc_parse(argv[5], "Hkv");
    a.Sq = fc_parse(argv[6], "Sq");
    a.Skv = fc_parse(argv[7], "Skv");
    a.Dqk = fc_parse(argv[8], "Dqk");
    a.Dv = fc_parse(argv[9], "Dv");
    a.tol = atof(argv[15]);
    if (!(a.tol > 0)) {
        fprintf(stderr, "forward_check: TOL must be positive\n");
        return 2;
    }
    a.nq = (size_t)a.B * a.H * a.Sq * a.Dqk;
    a.nk = (size_t)a.B * a.Hkv * a.Skv * a.Dqk;
    a.nv = (size_t)a.B * a.Hkv * a.Skv * a.Dv;
    a.no = (size_t)a.B * a.H * a.Sq * a.Dv;
    a.nrows_each = (size_t)a.B * a.H * a.Sq;
    a.q = (const uint16_t *)fc_read_all(argv[10], a.nq * 2);
    a.k = (const uint16_t *)fc_read_all(argv[11], a.nk * 2);
    a.v = (const uint16_t *)fc_read_all(argv[12], a.nv * 2);
    a.o_ref = (const float *)fc_read_all(argv[13], a.no * 4);
    a.rows_ref = NULL;
    a.n_rows = 0;
    if (strcmp(argv[14], "-") != 0) {
        FILE *fr = fopen(argv[14], "rb");
        long bytes = -1;
        if (fr != NULL && fseek(fr, 0, SEEK_END) == 0)
            bytes = ftell(fr);
        if (fr != NULL)
            fclose(fr);
        if (bytes <= 0 || (size_t)bytes % (a.nrows_each * 4) != 0 || (size_t)bytes / (a.nrows_each * 4) > 8) {
            fprintf(stderr, "forward_check: %s: not 1 to 8 f32 [B, H, Sq] row outputs\n", argv[14]);
            return 2;
        }
        a.n_rows = (int)((size_t)bytes / (a.nrows_each * 4));
        a.rows_ref = (const float *)fc_read_all(argv[14], (size_t)bytes);
    }

    st = aec_library_open(&lib, argv[1]);
    if (st != AEC_OK) {
        fprintf(stderr, "forward_check: %s: %s\n", aec_status_name(st), aec_last_error(&lib));
        return 4;
    }
    printf("device %s (compute capability %d.%d, builds %s, %d SMs): %s\n", lib.device_name, lib.cc_major,
           lib.cc_minor, lib.arch, lib.sm_count, which);
#ifdef AEC_HAVE_SOFTMAX_FORWARD
    if (strcmp(which, "softmax.forward") == 0)
        failed = fc_run_softmax(&lib, &a);
#endif
#ifdef AEC_HAVE_DECODE_FORWARD
    if (strcmp(which, "decode.forward") == 0)
        failed = fc_run_decode(&lib, &a);
#endif
    aec_library_close(&lib);
    free((void *)a.q);
    free((void *)a.k);
    free((void *)a.v);
    free((void *)a.o_ref);
    free((void *)a.rows_ref);
    if (failed < 0) {
        fprintf(stderr, "forward_check: `%s` is not checked by this program or not in the library at %s "
                        "(softmax.forward, decode.forward)\n", which, argv[1]);
        return 2;
    }
    return failed || check_failures ? 1 : 0;
}
