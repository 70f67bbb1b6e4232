/* Prints which cubin the generated header picks for the softmax forward on
   a GPU name and sizes given on the command line:
     tuning_pick "<gpu>" B H Sq Skv  ->  "<cubin>" or "error: <message>"
   The library struct is filled by hand (no driver): only `arch` and
   `device_name` matter to the pick. */
#include "aec_library.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    aec_library lib;
    aec_softmax_sizes s;
    char err[AEC_ERROR_CAPACITY];
    int record = -1;
    const char *cubin = NULL;
    if (argc != 6) {
        fprintf(stderr, "usage: %s GPU B H Sq Skv\n", argv[0]);
        return 2;
    }
    memset(&lib, 0, sizeof lib);
    snprintf(lib.arch, sizeof lib.arch, "sm_90a");
    snprintf(lib.device_name, sizeof lib.device_name, "%s", argv[1]);
    s.B = atoi(argv[2]);
    s.H = atoi(argv[3]);
    s.Hkv = s.H;
    s.Sq = atoi(argv[4]);
    s.Skv = atoi(argv[5]);
    s.Dqk = 128;
    s.Dv = 128;
    if (aecg_softmax_forward_pick(&lib, &s, &record, &cubin, err, sizeof err) != AEC_OK) {
        printf("error: %s\n", err);
        return 0;
    }
    printf("%s\n", cubin);
    return 0;
}
