/* Prints which cubin the generated header picks for the softmax forward or
   backward on a GPU name and sizes given on the command line:
     tuning_pick forward|backward "<gpu>" B H Sq Skv [SMs]
       ->  "<cubin>" or "error: <message>"
   The library struct is filled by hand (no driver): only `arch`,
   `device_name` and `sm_count` (132 unless given) matter to the pick. */
#include "aec_library.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    aec_library lib;
    aec_softmax_sizes s;
    char err[AEC_ERROR_CAPACITY];
    int record = -1, status;
    const char *cubin = NULL;
    if ((argc != 7 && argc != 8) || (strcmp(argv[1], "forward") != 0 && strcmp(argv[1], "backward") != 0)) {
        fprintf(stderr, "usage: %s forward|backward GPU B H Sq Skv [SMs]\n", argv[0]);
        return 2;
    }
    memset(&lib, 0, sizeof lib);
    snprintf(lib.arch, sizeof lib.arch, "sm_90a");
    snprintf(lib.device_name, sizeof lib.device_name, "%s", argv[2]);
    lib.sm_count = argc == 8 ? atoi(argv[7]) : 132;
    s.B = atoi(argv[3]);
    s.H = atoi(argv[4]);
    s.Hkv = s.H;
    s.Sq = atoi(argv[5]);
    s.Skv = atoi(argv[6]);
    s.Dqk = 128;
    s.Dv = 128;
    if (strcmp(argv[1], "forward") == 0)
        status = aecg_softmax_forward_pick(&lib, &s, &record, &cubin, err, sizeof err);
    else
        status = aecg_softmax_backward_pick(&lib, &s, &record, &cubin, err, sizeof err);
    if (status != AEC_OK) {
        printf("error: %s\n", err);
        return 0;
    }
    printf("%s\n", cubin);
    return 0;
}
