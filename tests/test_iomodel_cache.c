/* The IO model's DRAM figure: tile loads whose working set the last-level
 * cache holds are hits, so DRAM sees each tensor once; where it does not
 * fit, or the cache size is unknown, DRAM sees every tile load. */
#include "harness.h"
#include "planner.h"

static fa_attention_desc problem(int batch, int n, int heads, int dim) {
    fa_attention_desc d;
    fa_attention_desc_init(&d);
    d.batch = batch;
    d.seqlen_q = d.seqlen_k = n;
    d.heads_q = d.heads_kv = heads;
    d.head_dim = dim;
    d.q.dtype = d.k.dtype = d.v.dtype = d.o.dtype = FA_DTYPE_F16;
    return d;
}

static fa_kernel_plan tile(int br, int bc) {
    fa_kernel_plan k = {0};
    k.variant = FA_VARIANT_MMA;
    k.br = br;
    k.bc = bc;
    k.thread_rows = 4;
    k.thread_cols = bc / 4;
    k.work_group_size = 128;
    k.split_k = 1;
    return k;
}

static double dram(const fa_cost *c) { return c->dram_read_bytes + c->dram_write_bytes; }
static double tiles(const fa_cost *c) { return c->hbm_read_bytes + c->hbm_write_bytes; }

/* 16k tokens, hidden 2048 at N = 4096, d = 64 on an H100 (50 MiB of L2):
 * the forward reads Q, K, V and writes O and L once; the backward reads
 * Q, K, V, O, dO, L, D and writes dQ, dK, dV and D once, plus the fp32
 * dQ accumulator once each way. */
FA_TEST(fits_in_cache_each_tensor_once) {
    fa_device_desc dev = fa_described_device_find("h100")->desc;
    const fa_attention_desc d = problem(4, 4096, 32, 64);
    const double rows = 4.0 * 4096 * 32, t = rows * 64 * 2;
    fa_kernel_plan k = tile(128, 64);
    fa_cost f = fa_io_fused(&dev, &d, FA_PASS_FORWARD, &k);
    CHECK_NEAR(f.dram_read_bytes, 3.0 * t, 0.0);
    CHECK_NEAR(f.dram_write_bytes, t + rows * 4.0, 0.0);
    CHECK(tiles(&f) > 10.0 * dram(&f));
    k = tile(32, 128);
    fa_cost b = fa_io_fused(&dev, &d, FA_PASS_BACKWARD, &k);
    CHECK_NEAR(b.dram_read_bytes, 2.0 * t + 2.0 * t + (2.0 * t + rows * 8.0) + rows * 64 * 4.0, 0.0);
    CHECK_NEAR(b.dram_write_bytes, rows * 4.0 + 2.0 * t + t + rows * 64 * 4.0, 0.0);
    CHECK(dram(&b) < tiles(&b));
}

/* No cache size, or a working set past it (N = 1M: K and V of one head
 * are 512 MiB): every tile load reaches DRAM. */
FA_TEST(no_cache_or_too_large_every_tile_load) {
    fa_device_desc dev = fa_described_device_find("h100")->desc;
    fa_attention_desc d = problem(4, 4096, 32, 64);
    fa_kernel_plan k = tile(128, 64);
    dev.l2_cache_bytes = 0;
    for (int pass = 0; pass < 2; pass++) {
        fa_cost c = fa_io_fused(&dev, &d, pass ? FA_PASS_BACKWARD : FA_PASS_FORWARD, &k);
        CHECK(c.dram_read_bytes == c.hbm_read_bytes && c.dram_write_bytes == c.hbm_write_bytes);
    }
    dev = fa_described_device_find("h100")->desc;
    d = problem(1, 1 << 20, 16, 128);
    for (int pass = 0; pass < 2; pass++) {
        fa_cost c = fa_io_fused(&dev, &d, pass ? FA_PASS_BACKWARD : FA_PASS_FORWARD, &k);
        CHECK(c.dram_read_bytes == c.hbm_read_bytes && c.dram_write_bytes == c.hbm_write_bytes);
    }
}

/* Never more DRAM bytes than tile loads, and a larger cache never more;
 * standard attention streams its matrices once: DRAM = every load. */
FA_TEST(dram_bounded_and_monotone_in_cache) {
    fa_device_desc dev = fa_described_device_find("h100")->desc;
    static const int ns[] = {128, 1024, 8192, 65536}, dims[] = {64, 128};
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 2; j++) {
            fa_attention_desc d = problem(1, ns[i], 16, dims[j]);
            fa_kernel_plan k = tile(128, 64);
            double last = -1.0;
            for (size_t mib = 1; mib <= 1024; mib *= 4) {
                dev.l2_cache_bytes = mib << 20;
                for (int pass = 0; pass < 2; pass++) {
                    fa_cost c = fa_io_fused(&dev, &d, pass ? FA_PASS_BACKWARD : FA_PASS_FORWARD, &k);
                    CHECK(c.dram_read_bytes <= c.hbm_read_bytes && c.dram_write_bytes <= c.hbm_write_bytes);
                    if (pass == 0) {
                        CHECK_MSG(last < 0 || dram(&c) <= last, "N %d d %d: %.0f after %.0f", ns[i], dims[j], dram(&c),
                                  last);
                        last = dram(&c);
                    }
                }
            }
            fa_cost s = fa_io_standard(&dev, &d, FA_PASS_FORWARD);
            CHECK(s.dram_read_bytes == s.hbm_read_bytes && s.dram_write_bytes == s.hbm_write_bytes);
        }
}

FA_TEST_MAIN(FA_CASE(fits_in_cache_each_tensor_once), FA_CASE(no_cache_or_too_large_every_tile_load),
             FA_CASE(dram_bounded_and_monotone_in_cache))
