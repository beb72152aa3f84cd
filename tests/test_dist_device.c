/* Ring attention on every device backend present (fa-test-labels: device):
 * ranks as threads of this process over host memory (several ranks on one
 * device), and over NCCL with one GPU a rank where a process has two or
 * more CUDA devices, each against one context of the same backend on the
 * whole sequence (with dropout, the mask that context draws).
 * FA_TEST_LARGE=1 adds multi-tile problems on the matrix units (GPU
 * machines). */
#include "dist_check.h"
#include "harness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int devices_of(fa_backend backend) {
    int n = 0, count = 0;
    fa_device_info info;
    if (fa_device_count(&count) != FA_SUCCESS) return 0;
    for (int i = 0; i < count; i++)
        if (fa_device_get_info(i, &info) == FA_SUCCESS && info.backend == backend) n++;
    return n;
}

/* The cases every backend runs, on the transport given. */
static void cases_on(fa_backend backend, int nccl, int world) {
    dist_case c = dist_case_default(backend, world, FA_CP_ZIGZAG);
    c.nccl = nccl;
    c.causal = 1;
    dist_check_expect("causal fp32", &c);
    c.dtype = FA_DTYPE_BF16;
    c.heads_q = 4;
    c.heads_kv = 2;
    c.head_dim = 64;
    dist_check_expect("causal bf16 GQA d64", &c);
    c.dtype = FA_DTYPE_F16;
    c.causal = 0;
    c.layout = FA_CP_CONTIGUOUS;
    c.window_left = 9;
    c.window_right = 2;
    dist_check_expect("window (9, 2) fp16", &c);
    c.window_left = c.window_right = -1;
    c.causal = 1;
    c.layout = FA_CP_ZIGZAG;
    c.block_q = 12;
    c.block_k = 6;
    dist_check_expect("causal block mask 12x6 fp16", &c);
    static const int32_t cu[] = {0, 20, 21, 48};
    dist_case v = dist_case_default(backend, world, FA_CP_ZIGZAG);
    v.nccl = nccl;
    v.batch = 3;
    v.seqlen_q = v.seqlen_k = 27;
    v.cu_q = cu;
    v.causal = 1;
    v.dtype = FA_DTYPE_BF16;
    dist_check_expect("varlen causal bf16", &v);
    /* Dropout: the ring's pieces draw the whole sequence's mask from their
     * global positions. 96 tokens cut into chunks of multiples of 4; a
     * window of 41 shrinks some pieces to keys that start off a multiple
     * of 4, which the ring moves down to one. */
    dist_case p = dist_case_default(backend, world, FA_CP_ZIGZAG);
    p.nccl = nccl;
    p.seqlen_q = p.seqlen_k = 96;
    p.causal = 1;
    p.window_left = 41;
    p.dropout_p = 0.2f;
    p.dtype = FA_DTYPE_BF16;
    p.heads_q = 4;
    p.heads_kv = 2;
    p.head_dim = 64;
    dist_check_expect("causal window 41 dropout 0.2 bf16 GQA d64", &p);
    const char *large = getenv("FA_TEST_LARGE");
    if (large && strcmp(large, "1") == 0) {
        dist_case g = dist_case_default(backend, world, FA_CP_ZIGZAG);
        g.nccl = nccl;
        g.batch = 1;
        g.seqlen_q = g.seqlen_k = 4096;
        g.heads_q = 8;
        g.heads_kv = 2;
        g.head_dim = 128;
        g.causal = 1;
        g.dtype = FA_DTYPE_BF16;
        dist_check_expect("causal bf16 d128 4k tokens", &g);
        g.window_left = 700;
        g.dtype = FA_DTYPE_F16;
        dist_check_expect("causal window 700 fp16 d128 4k tokens", &g);
        g.window_left = -1;
        g.dropout_p = 0.1f;
        g.dtype = FA_DTYPE_BF16;
        dist_check_expect("causal dropout 0.1 bf16 d128 4k tokens", &g);
    }
}

static void on_backend(fa_backend backend) {
    const int n = devices_of(backend);
    if (n == 0) FA_SKIP("no device of this backend");
    for (int world = 2; world <= 4; world += 2) cases_on(backend, 0, world);
    if (backend == FA_BACKEND_CUDA && n >= 2) cases_on(backend, 1, n < 4 ? n : 4);
    else if (backend == FA_BACKEND_CUDA) printf("NCCL cases not run: %d CUDA device (two or more needed)\n", n);
}

FA_TEST(opencl) { on_backend(FA_BACKEND_OPENCL); }
FA_TEST(cuda) { on_backend(FA_BACKEND_CUDA); }
FA_TEST(hip) { on_backend(FA_BACKEND_HIP); }

FA_TEST_MAIN(FA_CASE(opencl), FA_CASE(cuda), FA_CASE(hip))
