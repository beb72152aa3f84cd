/* fa-run on the devices present: one-token sequences, whose reference
 * gradients dQ and dK are zero, must pass the check (issue 21, problem 7:
 * the relative error was infinite and fa-run reported FAIL).
 *
 * fa-test-labels: device */
#include "harness.h"
#include "test_util.h"

#include <stdlib.h>

static char output[1 << 16];

FA_TEST(fa_run_one_token) {
    static const fa_backend backends[] = {FA_BACKEND_OPENCL, FA_BACKEND_CUDA, FA_BACKEND_HIP};
    int ran = 0;
    for (size_t i = 0; i < sizeof backends / sizeof backends[0]; i++) {
        char reason[512];
        if (fa_backend_get_status(backends[i], reason, sizeof reason) != FA_SUCCESS) continue;
        const char *name = fa_backend_name(backends[i]);
        static const char *const dtypes[] = {"fp32", "fp16", "bf16"};
        for (int t = 0; t < 3; t++) {
            const int rc = fa_test_run_tool("fa-run",
                                            (const char *const[]){"--backend", name, "--seqlen", "1", "--dtype",
                                                                  dtypes[t], "--repeats", "1", NULL},
                                            output, sizeof output, 600.0);
            CHECK_MSG(rc == 0 && strstr(output, "PASS") != NULL,
                      "fa-run --backend %s --seqlen 1 --dtype %s: exit %d:\n%s", name, dtypes[t], rc, output);
        }
        ran++;
    }
    if (!ran) FA_SKIP("no OpenCL, CUDA or HIP device");
}

FA_TEST_MAIN(FA_CASE(fa_run_one_token))
