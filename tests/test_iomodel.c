/* The IO model: FLOPs, the visible fraction of the score matrix, predicted
 * HBM bytes of fused and standard attention, peak rates and the roofline. */
#include "harness.h"
#include "planner.h"
#include "test_util.h"

#include <stdint.h>

static const fa_device_desc *device(const char *key) {
    const fa_described_device *d = fa_described_device_find(key);
    if (!d) {
        fprintf(stderr, "described device %s missing\n", key);
        exit(1);
    }
    return &d->desc;
}

static void set_dtype(fa_attention_desc *d, fa_dtype t) { d->q.dtype = d->k.dtype = d->v.dtype = d->o.dtype = t; }

static fa_attention_desc shape(int batch, int sq, int sk, int hq, int hkv, int dim, fa_dtype t) {
    fa_attention_desc d;
    fa_attention_desc_init(&d);
    d.batch = batch;
    d.seqlen_q = sq;
    d.seqlen_k = sk;
    d.heads_q = hq;
    d.heads_kv = hkv;
    d.head_dim = dim;
    set_dtype(&d, t);
    return d;
}

static int rand_int(fa_rng *r, int lo, int hi) { return lo + (int)(fa_rng_next(r) % (uint64_t)(hi - lo + 1)); }

static double total_bytes(const fa_cost *c) { return c->hbm_read_bytes + c->hbm_write_bytes; }

/* The header's mask rules, cell by cell. */
static int band_visible(const fa_attention_desc *d, int sq, int sk, int i, int j) {
    long off = (long)sk - sq;
    if (d->causal && j > i + off) return 0;
    if (d->window_left >= 0 && j < i + off - d->window_left) return 0;
    if (d->window_right >= 0 && j > i + off + d->window_right) return 0;
    return 1;
}

static int block_visible(const fa_attention_desc *d, int i, int j) {
    if (!d->block_mask) return 1;
    int cols = (d->seqlen_k + d->block_k - 1) / d->block_k;
    return d->block_mask[(size_t)(i / d->block_q) * (size_t)cols + (size_t)(j / d->block_k)] != 0;
}

static void seq_len(const fa_attention_desc *d, int b, int *sq, int *sk) {
    if (d->cu_seqlens_q) {
        *sq = d->cu_seqlens_q[b + 1] - d->cu_seqlens_q[b];
        *sk = d->cu_seqlens_k[b + 1] - d->cu_seqlens_k[b];
    } else {
        *sq = d->seqlen_q;
        *sk = d->seqlen_k;
    }
}

static double brute_fraction(const fa_attention_desc *d) {
    double vis = 0, all = 0;
    for (int b = 0; b < d->batch; b++) {
        int sq, sk;
        seq_len(d, b, &sq, &sk);
        for (int i = 0; i < sq; i++)
            for (int j = 0; j < sk; j++) {
                all += 1;
                vis += band_visible(d, sq, sk, i, j) && block_visible(d, i, j);
            }
    }
    return all > 0 ? vis / all : 0.0;
}

/* A random mask configuration on a random small shape. */
typedef struct masked_case {
    fa_attention_desc d;
    uint8_t mask[4096];
    int32_t cu_q[9], cu_k[9];
} masked_case;

static void random_case(fa_rng *r, masked_case *c) {
    c->d = shape(rand_int(r, 1, 3), rand_int(r, 1, 70), rand_int(r, 1, 70), 4, 2, 16, FA_DTYPE_F16);
    fa_attention_desc *d = &c->d;
    d->causal = rand_int(r, 0, 1);
    d->window_left = rand_int(r, 0, 2) ? -1 : rand_int(r, 0, 20);
    d->window_right = rand_int(r, 0, 2) ? -1 : rand_int(r, 0, 20);
    if (rand_int(r, 0, 1)) {
        d->block_q = rand_int(r, 1, 24);
        d->block_k = rand_int(r, 1, 24);
        size_t rows = (size_t)(d->seqlen_q + d->block_q - 1) / (size_t)d->block_q;
        size_t cols = (size_t)(d->seqlen_k + d->block_k - 1) / (size_t)d->block_k;
        for (size_t i = 0; i < rows * cols; i++) c->mask[i] = (uint8_t)(rand_int(r, 0, 2) != 0);
        d->block_mask = c->mask;
        d->block_mask_bytes = rows * cols;
    }
    if (rand_int(r, 0, 1)) {
        /* Variable lengths (an empty sequence now and then); seqlen_q/k stay
         * the longest lengths allowed, as the header says. */
        c->cu_q[0] = c->cu_k[0] = 0;
        for (int b = 0; b < d->batch; b++) {
            c->cu_q[b + 1] = c->cu_q[b] + rand_int(r, 0, d->seqlen_q);
            c->cu_k[b + 1] = c->cu_k[b] + rand_int(r, 0, d->seqlen_k);
        }
        d->cu_seqlens_q = c->cu_q;
        d->cu_seqlens_k = c->cu_k;
    }
}

FA_TEST(flops_known_shapes) {
    fa_attention_desc d = shape(2, 256, 256, 4, 2, 64, FA_DTYPE_F16);
    double fwd = 4.0 * 2 * 4 * 256.0 * 256.0 * 64;
    CHECK_NEAR(fa_attention_flops(&d, FA_PASS_FORWARD), fwd, 0.0);
    CHECK_NEAR(fa_attention_flops(&d, FA_PASS_BACKWARD), 2.5 * fwd, 0.0);
    CHECK_NEAR(fa_visible_fraction(&d), 1.0, 0.0);

    d = shape(3, 100, 300, 8, 8, 128, FA_DTYPE_F32);
    CHECK_NEAR(fa_attention_flops(&d, FA_PASS_FORWARD), 4.0 * 3 * 8 * 100.0 * 300.0 * 128, 0.0);

    /* Variable lengths: the sum over sequences of sq_b * sk_b. */
    int32_t cu_q[] = {0, 100, 350, 351}, cu_k[] = {0, 50, 450, 460};
    d = shape(3, 250, 400, 6, 3, 32, FA_DTYPE_BF16);
    d.cu_seqlens_q = cu_q;
    d.cu_seqlens_k = cu_k;
    double cells = 100.0 * 50 + 250.0 * 400 + 1.0 * 10;
    CHECK_NEAR(fa_attention_flops(&d, FA_PASS_FORWARD), 4.0 * 6 * 32 * cells, 0.0);
    CHECK_NEAR(fa_attention_flops(&d, FA_PASS_BACKWARD), 2.5 * 4.0 * 6 * 32 * cells, 0.0);
}

FA_TEST(causal_flops_half) {
    for (int n = 1; n <= 4096; n = n * 3 + 1) {
        fa_attention_desc d = shape(2, n, n, 4, 4, 64, FA_DTYPE_F16);
        double full = fa_attention_flops(&d, FA_PASS_FORWARD);
        d.causal = 1;
        /* Row i sees keys 0..i: n (n + 1) / 2 cells. */
        double frac = (double)(n + 1) / (2.0 * n);
        CHECK_NEAR(fa_visible_fraction(&d), frac, 1e-15);
        CHECK_NEAR(fa_attention_flops(&d, FA_PASS_FORWARD), full * frac, 1e-9 * full);
        if (n >= 1000) CHECK(fa_visible_fraction(&d) > 0.5 && fa_visible_fraction(&d) < 0.5006);
    }
    /* Bottom-right alignment: 3 queries over 5 keys see 3 + 4 + 5 keys;
     * 5 queries over 3 keys see 0 + 0 + 1 + 2 + 3. */
    fa_attention_desc d = shape(1, 3, 5, 1, 1, 8, FA_DTYPE_F32);
    d.causal = 1;
    CHECK_NEAR(fa_visible_fraction(&d), 12.0 / 15.0, 1e-15);
    d = shape(1, 5, 3, 1, 1, 8, FA_DTYPE_F32);
    d.causal = 1;
    CHECK_NEAR(fa_visible_fraction(&d), 6.0 / 15.0, 1e-15);
}

FA_TEST(visible_fraction_brute_force) {
    fa_rng r;
    fa_rng_seed(&r, 0x5eed1u);
    static masked_case c;
    int with_blocks = 0, varlen = 0, windows = 0;
    for (int it = 0; it < 600; it++) {
        random_case(&r, &c);
        with_blocks += c.d.block_mask != NULL;
        varlen += c.d.cu_seqlens_q != NULL;
        windows += c.d.window_left >= 0 || c.d.window_right >= 0;
        double want = brute_fraction(&c.d);
        double got = fa_visible_fraction(&c.d);
        CHECK_MSG(fabs(got - want) <= 1e-14, "case %d: %d x %d causal %d window %d/%d blocks %d x %d: %.17g vs %.17g",
                  it, c.d.seqlen_q, c.d.seqlen_k, c.d.causal, c.d.window_left, c.d.window_right, c.d.block_q,
                  c.d.block_k, got, want);
    }
    CHECK(with_blocks > 100 && varlen > 100 && windows > 100);
}

/* Long sequences take the closed forms: exact against a per-row count. */
FA_TEST(visible_fraction_long_sequences) {
    const int n = 1 << 20, m = (1 << 20) + 12345;
    fa_attention_desc d = shape(1, n, m, 1, 1, 64, FA_DTYPE_F16);
    d.causal = 1;
    d.window_left = 4096;
    d.window_right = 7;
    double vis = 0;
    long off = (long)m - n;
    for (long i = 0; i < n; i++) {
        long lo = i + off - d.window_left, hi = i + off; /* causal is the tighter bound */
        if (lo < 0) lo = 0;
        if (hi > m - 1) hi = m - 1;
        if (hi >= lo) vis += (double)(hi - lo + 1);
    }
    CHECK_NEAR(fa_visible_fraction(&d), vis / ((double)n * m), 1e-15);
}

/* Rows of the key tiles each query tile visits (and the reverse), by walking
 * every tile and every cell: a tile is visited when some cell of it is in
 * the causal/window band and some block it overlaps is on. */
static void brute_tiles(const fa_attention_desc *d, int sq, int sk, int br, int bc, double *key_rows,
                        double *query_rows) {
    for (int r0 = 0; r0 < sq; r0 += br)
        for (int c0 = 0; c0 < sk; c0 += bc) {
            int r1 = r0 + br < sq ? r0 + br : sq, c1 = c0 + bc < sk ? c0 + bc : sk;
            int band = 0, block = 0;
            for (int i = r0; i < r1; i++)
                for (int j = c0; j < c1; j++) {
                    band |= band_visible(d, sq, sk, i, j);
                    block |= block_visible(d, i, j);
                }
            if (band && block) {
                *key_rows += c1 - c0;
                *query_rows += r1 - r0;
            }
        }
}

FA_TEST(tile_visits_brute_force) {
    fa_rng r;
    fa_rng_seed(&r, 0x711e5u);
    static masked_case c;
    const fa_device_desc *cuda = device("h100"), *opencl = device("arc-a770");
    for (int it = 0; it < 400; it++) {
        random_case(&r, &c);
        const fa_attention_desc *d = &c.d;
        fa_kernel_plan kp;
        memset(&kp, 0, sizeof kp);
        kp.variant = FA_VARIANT_SIMT;
        kp.br = 8 << rand_int(&r, 0, 2);
        kp.bc = 8 << rand_int(&r, 0, 2);
        kp.split_k = 1;
        const double e = 2.0, dim = d->head_dim, hq = d->heads_q, hkv = d->heads_kv;
        double fwd_rd = 0, fwd_wr = 0, acc_rd = 0, acc_wr = 0, cl_rd = 0, cl_wr = 0;
        for (int b = 0; b < d->batch; b++) {
            int sq, sk;
            seq_len(d, b, &sq, &sk);
            double kr = 0, qr = 0;
            brute_tiles(d, sq, sk, kp.br, kp.bc, &kr, &qr);
            /* Forward: Q, O, L once; K and V per visited tile. */
            fwd_rd += hq * sq * dim * e + hq * kr * 2 * dim * e;
            fwd_wr += hq * sq * dim * e + hq * sq * 4;
            /* Backward, both schemes: D from O and dO; K, V read and dK, dV
             * written once per kv head; Q, dO, L, D per visited tile. */
            double common_rd = 2 * hq * sq * dim * e + 2 * hkv * sk * dim * e + hq * qr * (2 * dim * e + 8);
            double common_wr = hq * sq * 4 + 2 * hkv * sk * dim * e;
            /* fp32 dQ accumulator: zeroed, read and written per visited tile,
             * converted at the end. */
            acc_rd += common_rd + hq * qr * dim * 4 + hq * sq * dim * 4;
            acc_wr += common_wr + hq * sq * dim * 4 + hq * qr * dim * 4 + hq * sq * dim * e;
            /* dQ kernel of its own: Q, dO, L, D once, K and V per visited tile. */
            cl_rd += common_rd + hq * sq * (2 * dim * e + 8) + hq * kr * 2 * dim * e;
            cl_wr += common_wr + hq * sq * dim * e;
        }
        fa_cost f = fa_io_fused(cuda, d, FA_PASS_FORWARD, &kp);
        fa_cost a = fa_io_fused(cuda, d, FA_PASS_BACKWARD, &kp);
        fa_cost o = fa_io_fused(opencl, d, FA_PASS_BACKWARD, &kp);
        /* OpenCL's streaming kernels: the forward's bytes, and the fp32 dQ
         * accumulator backward (a dQ kernel of its own in deterministic
         * mode). */
        fa_kernel_plan ks = kp;
        ks.variant = FA_VARIANT_SIMT_STREAM;
        fa_cost sf = fa_io_fused(opencl, d, FA_PASS_FORWARD, &ks);
        fa_cost sa = fa_io_fused(opencl, d, FA_PASS_BACKWARD, &ks);
        fa_attention_desc det = *d;
        det.deterministic = 1;
        fa_cost sd = fa_io_fused(opencl, &det, FA_PASS_BACKWARD, &ks);
        CHECK_MSG(sf.hbm_read_bytes == fwd_rd && sf.hbm_write_bytes == fwd_wr, "case %d: streaming forward", it);
        CHECK_MSG(sa.hbm_read_bytes == acc_rd && sa.hbm_write_bytes == acc_wr, "case %d: streaming backward", it);
        CHECK_MSG(sd.hbm_read_bytes == cl_rd && sd.hbm_write_bytes == cl_wr, "case %d: deterministic streaming", it);
        CHECK_MSG(f.hbm_read_bytes == fwd_rd && f.hbm_write_bytes == fwd_wr,
                  "case %d (%d x %d, br %d bc %d): forward %.0f/%.0f, expected %.0f/%.0f", it, d->seqlen_q,
                  d->seqlen_k, kp.br, kp.bc, f.hbm_read_bytes, f.hbm_write_bytes, fwd_rd, fwd_wr);
        CHECK_MSG(a.hbm_read_bytes == acc_rd && a.hbm_write_bytes == acc_wr,
                  "case %d: backward (accumulator) %.0f/%.0f, expected %.0f/%.0f", it, a.hbm_read_bytes,
                  a.hbm_write_bytes, acc_rd, acc_wr);
        CHECK_MSG(o.hbm_read_bytes == cl_rd && o.hbm_write_bytes == cl_wr,
                  "case %d: backward (dQ kernel) %.0f/%.0f, expected %.0f/%.0f", it, o.hbm_read_bytes,
                  o.hbm_write_bytes, cl_rd, cl_wr);
    }
}

/* The IO model's tile counts as it computed them before they had a closed
 * form: query tile by query tile (time proportional to the sequence). The
 * oracle the closed form must match exactly. */
static void oracle_seq_tiles(const fa_attention_desc *d, int64_t sq, int64_t sk, int64_t br, int64_t bc,
                             double *pairs_out, double *key_rows_out, double *query_rows_out) {
    const int64_t off = sk - sq, open = INT64_C(1) << 32;
    int64_t lo = -open, hi = open;
    if (d->causal) hi = off;
    if (d->window_right >= 0 && off + d->window_right < hi) hi = off + d->window_right;
    if (d->window_left >= 0) lo = off - d->window_left;
    if (lo > hi || sq <= 0 || sk <= 0) return;
    const int64_t cols = d->block_mask ? ((int64_t)d->seqlen_k + d->block_k - 1) / d->block_k : 0;
    for (int64_t r0 = 0; r0 < sq; r0 += br) {
        const int64_t r1 = r0 + br < sq ? r0 + br : sq;
        const int64_t jlo = r0 + lo > 0 ? r0 + lo : 0, jhi = r1 - 1 + hi < sk - 1 ? r1 - 1 + hi : sk - 1;
        if (jlo > jhi) continue;
        int64_t pairs = 0, rows = 0;
        for (int64_t kt = jlo / bc; kt <= jhi / bc; kt++) {
            const int64_t c0 = kt * bc, c1 = c0 + bc < sk ? c0 + bc : sk;
            int on = !d->block_mask;
            for (int64_t bi = on ? 0 : r0 / d->block_q; !on && bi <= (r1 - 1) / d->block_q; bi++)
                for (int64_t bj = c0 / d->block_k; bj <= (c1 - 1) / d->block_k && !on; bj++)
                    on = d->block_mask[bi * cols + bj] != 0;
            if (!on) continue;
            pairs++;
            rows += c1 - c0;
        }
        *pairs_out += (double)pairs;
        *key_rows_out += (double)rows;
        *query_rows_out += (double)pairs * (double)(r1 - r0);
    }
}

static void check_against_oracle(const fa_attention_desc *d, int br, int bc, int it) {
    double pairs = 0, key_rows = 0, query_rows = 0;
    for (int b = 0; b < d->batch; b++) {
        int sq, sk;
        seq_len(d, b, &sq, &sk);
        oracle_seq_tiles(d, sq, sk, br, bc, &pairs, &key_rows, &query_rows);
    }
    const fa_tile_visits v = fa_io_tile_visits(d, br, bc);
    CHECK_MSG(v.pairs == pairs && v.key_rows == key_rows && v.query_rows == query_rows,
              "case %d (b %d, %d x %d, causal %d, window %d/%d, blocks %d x %d%s, br %d bc %d): pairs %.0f/%.0f "
              "key rows %.0f/%.0f query rows %.0f/%.0f",
              it, d->batch, d->seqlen_q, d->seqlen_k, d->causal, d->window_left, d->window_right,
              d->block_mask ? d->block_q : 0, d->block_mask ? d->block_k : 0, d->cu_seqlens_q ? " varlen" : "", br, bc,
              v.pairs, pairs, v.key_rows, key_rows, v.query_rows, query_rows);
}

/* The closed-form tile counts against the tile-by-tile walk, on small and
 * odd shapes (tiles of any size, not only the planner's) and on sequences
 * of a few thousand with windows and block masks. */
FA_TEST(tile_counts_match_the_walk) {
    fa_rng r;
    fa_rng_seed(&r, 0xc105edu);
    static masked_case c;
    for (int it = 0; it < 3000; it++) {
        random_case(&r, &c);
        check_against_oracle(&c.d, rand_int(&r, 1, 40), rand_int(&r, 1, 40), it);
        check_against_oracle(&c.d, 8 << rand_int(&r, 0, 4), 8 << rand_int(&r, 0, 4), it);
    }
    static uint8_t mask[64 * 64];
    for (int it = 0; it < 200; it++) {
        fa_attention_desc d = shape(rand_int(&r, 1, 2), rand_int(&r, 1, 3000), rand_int(&r, 1, 3000), 2, 1, 64,
                                    FA_DTYPE_F16);
        d.causal = rand_int(&r, 0, 1);
        d.window_left = rand_int(&r, 0, 1) ? -1 : rand_int(&r, 0, 700);
        d.window_right = rand_int(&r, 0, 1) ? -1 : rand_int(&r, 0, 700);
        if (rand_int(&r, 0, 1)) {
            d.block_q = rand_int(&r, 48, 400);
            d.block_k = rand_int(&r, 48, 400);
            size_t rows = (size_t)(d.seqlen_q + d.block_q - 1) / (size_t)d.block_q;
            size_t cols = (size_t)(d.seqlen_k + d.block_k - 1) / (size_t)d.block_k;
            for (size_t i = 0; i < rows * cols; i++) mask[i] = (uint8_t)(rand_int(&r, 0, 3) != 0);
            d.block_mask = mask;
            d.block_mask_bytes = rows * cols;
        }
        check_against_oracle(&d, 8 << rand_int(&r, 0, 4), 8 << rand_int(&r, 0, 4), 3000 + it);
    }
}

/* The FlashAttention-2 benchmark setting: batch x seqlen = 16k tokens,
 * hidden 2048 (enough work-groups that tiles are not shrunk to fill the
 * device). */
static fa_attention_desc fa2_setting(int n, int dim, fa_dtype t) {
    int batch = 16384 / n > 0 ? 16384 / n : 1;
    return shape(batch, n, n, 2048 / dim, 2048 / dim, dim, t);
}

FA_TEST(fused_bytes_scale_n2) {
    for (int i = 0; i < fa_described_device_count(); i++) {
        const fa_device_desc *dev = &fa_described_device_get(i)->desc;
        for (int causal = 0; causal <= 1; causal++) {
            fa_attention_desc d1 = shape(1, 8192, 8192, 16, 16, 64, FA_DTYPE_F16);
            d1.causal = causal;
            fa_attention_desc d2 = d1;
            d2.seqlen_q = d2.seqlen_k = 16384;
            fa_plan_info p1, p2;
            CHECK_OK(fa_plan_for_device(dev, &d1, &p1));
            CHECK_OK(fa_plan_for_device(dev, &d2, &p2));
            CHECK(p1.forward.br == p2.forward.br && p1.backward.bc == p2.backward.bc);
            double rf = total_bytes(&p2.forward.cost) / total_bytes(&p1.forward.cost);
            double rb = total_bytes(&p2.backward.cost) / total_bytes(&p1.backward.cost);
            /* Q, O and L grow 2x, the K/V re-reads 4x: under a causal mask
             * with the 192-row tiles of sm_90's warp-specialised forward
             * the re-reads are a smaller share (3.86x at head_dim 64). */
            CHECK_MSG(rf > (causal ? 3.8 : 3.9) && rf <= 4.0, "%s causal %d: forward bytes grow %.4fx",
                      fa_described_device_get(i)->key, causal, rf);
            CHECK_MSG(rb > 3.8 && rb <= 4.0, "%s causal %d: backward bytes grow %.4fx",
                      fa_described_device_get(i)->key, causal, rb);
        }
    }
}

/* The K/V re-read term: forward bytes less Q, O and L. */
static double kv_term(const fa_attention_desc *d, const fa_cost *c) {
    double rows = (double)d->batch * d->seqlen_q * d->heads_q;
    return total_bytes(c) - rows * (2.0 * d->head_dim * (double)fa_dtype_size(d->q.dtype) + 4.0);
}

FA_TEST(fused_bytes_scale_d2_over_m) {
    /* With the tile shape given: doubling br halves the K/V re-reads. */
    const fa_device_desc *h100 = device("h100");
    fa_attention_desc d = shape(2, 4096, 4096, 8, 8, 128, FA_DTYPE_F16);
    fa_kernel_plan kp;
    memset(&kp, 0, sizeof kp);
    kp.variant = FA_VARIANT_SIMT;
    kp.bc = 32;
    kp.split_k = 1;
    kp.br = 64;
    fa_cost c64 = fa_io_fused(h100, &d, FA_PASS_FORWARD, &kp);
    double kv64 = kv_term(&d, &c64);
    kp.br = 128;
    fa_cost c128 = fa_io_fused(h100, &d, FA_PASS_FORWARD, &kp);
    CHECK_NEAR(kv_term(&d, &c128), kv64 / 2.0, 1e-9 * kv64);
    /* N / br tiles each reading all N keys and values. */
    CHECK_NEAR(kv64, 2.0 * 8 * (4096.0 / 64) * 4096.0 * 2 * 128 * 2, 0.0);

    /* Through the planner, on SIMT tiles (fp32 in local memory):
     * 64 KiB fits br = 128 at d = 64 but only br = 64 at d = 128, and
     * 128 KiB fits br = 128 at d = 128 again, so the K/V term goes as
     * d^2 / M: x4 for d doubled, /2 for M doubled. (On a backend without
     * the streaming kernels, which hold no tile over the whole head_dim
     * and so escape the law; see below.) */
    fa_device_desc dev = *device("pocl-cpu");
    dev.backend = FA_BACKEND_HIP;
    fa_attention_desc d64 = shape(2, 4096, 4096, 8, 8, 64, FA_DTYPE_F32);
    fa_attention_desc d128 = shape(2, 4096, 4096, 8, 8, 128, FA_DTYPE_F32);
    fa_plan_info a, b, c;
    dev.local_mem_bytes = 64 * 1024;
    CHECK_OK(fa_plan_for_device(&dev, &d64, &a));
    CHECK_OK(fa_plan_for_device(&dev, &d128, &b));
    dev.local_mem_bytes = 128 * 1024;
    CHECK_OK(fa_plan_for_device(&dev, &d128, &c));
    CHECK(a.forward.br == 128 && b.forward.br == 64 && c.forward.br == 128);
    double ka = kv_term(&d64, &a.forward.cost), kb = kv_term(&d128, &b.forward.cost),
           kc = kv_term(&d128, &c.forward.cost);
    CHECK_NEAR(kb / ka, 4.0, 1e-12);
    CHECK_NEAR(kc / kb, 0.5, 1e-12);
    /* OpenCL's streaming kernels keep br = 128 at d = 128 in 64 KiB: the
     * K/V term only doubles with d. */
    dev.backend = FA_BACKEND_OPENCL;
    dev.local_mem_bytes = 64 * 1024;
    CHECK_OK(fa_plan_for_device(&dev, &d128, &c));
    CHECK(c.forward.variant == FA_VARIANT_SIMT_STREAM && c.forward.br == 128);
    CHECK_NEAR(kv_term(&d128, &c.forward.cost) / ka, 2.0, 1e-12);
}

FA_TEST(fused_below_standard) {
    int compared = 0;
    for (int i = 0; i < fa_described_device_count(); i++) {
        const fa_described_device *dd = fa_described_device_get(i);
        for (int dim = 64; dim <= 128; dim *= 2)
            for (int t = 0; t < 3; t++)
                for (int causal = 0; causal <= 1; causal++)
                    for (int n = 256; n <= 16384; n *= 2) {
                        fa_attention_desc d = fa2_setting(n, dim, (fa_dtype)t);
                        d.causal = causal;
                        fa_plan_info p;
                        CHECK_OK(fa_plan_for_device(&dd->desc, &d, &p));
                        double f = total_bytes(&p.fused_forward), s = total_bytes(&p.standard_forward);
                        CHECK_MSG(f < s, "%s d %d %s causal %d N %d: forward fused %.4g >= standard %.4g", dd->key,
                                  dim, fa_dtype_name((fa_dtype)t), causal, n, f, s);
                        /* The backward re-reads Q and dO per key tile (and K, V
                         * or the fp32 dQ accumulator): with fp32 tiles in 48-64
                         * KiB at d = 128 its tiles are too small to beat the
                         * materialised matrices, so it is compared where the
                         * tiles are large: d = 64, or the H100's 227 KiB and
                         * the CPU's 1 MiB. */
                        if (dim == 64 || strcmp(dd->key, "h100") == 0 || strcmp(dd->key, "pocl-cpu") == 0) {
                            double fb = total_bytes(&p.fused_backward), sb = total_bytes(&p.standard_backward);
                            CHECK_MSG(fb < sb, "%s d %d %s causal %d N %d: backward fused %.4g >= standard %.4g",
                                      dd->key, dim, fa_dtype_name((fa_dtype)t), causal, n, fb, sb);
                        }
                        compared++;
                    }
    }
    CHECK(compared == fa_described_device_count() * 2 * 3 * 2 * 7);
}

FA_TEST(standard_bytes_grow_n2) {
    const fa_device_desc *dev = device("h100");
    for (int t = 0; t < 3; t++) {
        double prev_f = 0, prev_b = 0;
        for (int n = 256; n <= 65536; n *= 2) {
            fa_attention_desc d = shape(1, n, n, 8, 8, 128, (fa_dtype)t);
            fa_cost f = fa_io_standard(dev, &d, FA_PASS_FORWARD), b = fa_io_standard(dev, &d, FA_PASS_BACKWARD);
            double e = (double)fa_dtype_size((fa_dtype)t), nn = (double)n * n * 8 * e;
            /* Four N x N passes forward (S written, read; P written, read),
             * ten backward; the rest is linear in N. */
            CHECK(total_bytes(&f) > 4 * nn && total_bytes(&f) < 4 * nn + 8.0 * n * 8 * (128 * e + 4));
            CHECK(total_bytes(&b) > 10 * nn && total_bytes(&b) < 10 * nn + 16.0 * n * 8 * (128 * e + 4));
            if (prev_f > 0) {
                /* Doubling N: between 2x (linear terms) and 4x, and near 4x
                 * once N is well above head_dim. */
                double rf = total_bytes(&f) / prev_f, rb = total_bytes(&b) / prev_b;
                CHECK_MSG(rf > 2.0 && rf <= 4.0 && rb > 2.0 && rb <= 4.0, "N %d: %.4f, %.4f", n, rf, rb);
                if (n >= 8192) CHECK_MSG(rf > 3.9 && rb > 3.9, "N %d: %.4f, %.4f", n, rf, rb);
            }
            prev_f = total_bytes(&f);
            prev_b = total_bytes(&b);
        }
    }
}

FA_TEST(splitk_partials_cost) {
    const fa_device_desc *dev = device("nvidia-opencl");
    fa_attention_desc d = shape(1, 4, 32768, 8, 2, 128, FA_DTYPE_BF16);
    fa_kernel_plan kp;
    memset(&kp, 0, sizeof kp);
    kp.variant = FA_VARIANT_SIMT;
    kp.br = 8;
    kp.bc = 64;
    kp.split_k = 1;
    fa_cost one = fa_io_fused(dev, &d, FA_PASS_FORWARD, &kp);
    kp.variant = FA_VARIANT_SPLITK;
    kp.split_k = 16;
    fa_cost split = fa_io_fused(dev, &d, FA_PASS_FORWARD, &kp);
    /* Every split reads Q and writes fp32 partial O and L, which the merge
     * reads back. */
    double partials = 16.0 * 8 * 4 * (128 + 1) * 4;
    double extra_q = 15.0 * 8 * 4 * 128 * 2;
    CHECK_NEAR(split.hbm_read_bytes - one.hbm_read_bytes, partials + extra_q, 0.0);
    CHECK_NEAR(split.hbm_write_bytes - one.hbm_write_bytes, partials, 0.0);
    CHECK_NEAR(split.flops, one.flops, 0.0);
    /* Eight work-groups on 132 compute units use 8/132 of the compute rate
     * and draw 8/132 of the bandwidth; 128 split work-groups almost all. */
    const double units = dev->compute_units;
    CHECK_NEAR(one.memory_ms, total_bytes(&one) / (fa_device_bandwidth(dev) * 8 / units) * 1e3,
               1e-12 * one.memory_ms);
    CHECK_NEAR(split.memory_ms, total_bytes(&split) / (fa_device_bandwidth(dev) * 128 / units) * 1e3,
               1e-12 * split.memory_ms);
    CHECK(split.compute_ms < one.compute_ms / 10 && split.roofline_ms < one.roofline_ms / 10);
}

FA_TEST(peak_rates_and_roofline) {
    const fa_device_desc *h100 = device("h100"), *ncl = device("nvidia-opencl"), *mi = device("mi250x");
    double base = 132.0 * 1980e6;
    CHECK_NEAR(fa_device_peak_flops(h100, FA_DTYPE_F16, 0), base * 4096, 1.0);
    CHECK_NEAR(fa_device_peak_flops(h100, FA_DTYPE_BF16, 0), base * 4096, 1.0);
    CHECK_NEAR(fa_device_peak_flops(h100, FA_DTYPE_F32, 0), base * 256, 1.0);
    CHECK_NEAR(fa_device_peak_flops(h100, FA_DTYPE_F32, 1), base * 2048, 1.0);
    /* NVIDIA's OpenCL reaches the tensor cores through mma.sync: the
     * H100's dense rate for fp16, its FMA rate for fp32. */
    CHECK_NEAR(fa_device_peak_flops(ncl, FA_DTYPE_F16, 0), base * 4096, 1.0);
    CHECK_NEAR(fa_device_peak_flops(ncl, FA_DTYPE_F32, 0), base * 256, 1.0);
    CHECK_NEAR(fa_device_peak_flops(mi, FA_DTYPE_F16, 0), 110.0 * 1700e6 * 1024, 1.0);
    CHECK_NEAR(fa_device_bandwidth(h100), 3350e9, 1.0);
    CHECK_NEAR(fa_device_bandwidth(mi), 1600e9, 1.0);

    for (int i = 0; i < fa_described_device_count(); i++) {
        const fa_device_desc *dev = &fa_described_device_get(i)->desc;
        for (int causal = 0; causal <= 1; causal++) {
            fa_attention_desc d = fa2_setting(2048, 64, FA_DTYPE_F16);
            d.causal = causal;
            fa_plan_info p;
            CHECK_OK(fa_plan_for_device(dev, &d, &p));
            const fa_cost *costs[] = {&p.forward.cost, &p.backward.cost, &p.standard_forward,
                                      &p.standard_backward};
            /* Enough work-groups to cover the device: the full bandwidth. */
            CHECK(p.forward.num_work_groups >= dev->compute_units && p.backward.num_work_groups >= dev->compute_units);
            for (int k = 0; k < 4; k++) {
                const fa_cost *c = costs[k];
                CHECK(c->compute_ms > 0 && c->memory_ms > 0);
                CHECK_NEAR(c->roofline_ms, fmax(c->compute_ms, c->memory_ms), 0.0);
                CHECK_NEAR(c->memory_ms, total_bytes(c) / fa_device_bandwidth(dev) * 1e3, 1e-12 * c->memory_ms);
            }
            /* The paper's FLOP count, in every cost. */
            CHECK_NEAR(p.forward.cost.flops, fa_attention_flops(&d, FA_PASS_FORWARD), 0.0);
            CHECK_NEAR(p.backward.cost.flops, fa_attention_flops(&d, FA_PASS_BACKWARD), 0.0);
            /* Fused compute time is no less than its FLOPs at the peak rate
             * (padded tiles and the last wave only add). */
            double peak = fa_variant_on_matrix_units(p.forward.variant) ? fa_device_peak_flops(dev, FA_DTYPE_F16, 0) : fa_device_peak_flops(dev, FA_DTYPE_F32, 0);
            CHECK(p.forward.cost.compute_ms >= p.forward.cost.flops / peak * 1e3 * (1 - 1e-12));
        }
    }
}

/* A kernel plan of one tile shape for the model alone (no backend). */
static fa_kernel_plan tile_plan(fa_variant variant, int br, int bc, int tr, int tc) {
    fa_kernel_plan kp;
    memset(&kp, 0, sizeof kp);
    kp.variant = variant;
    kp.br = br;
    kp.bc = bc;
    kp.thread_rows = tr;
    kp.thread_cols = tc;
    kp.split_k = 1;
    return kp;
}

/* The streaming kernels' compute time, by hand, for NVIDIA's OpenCL's
 * head_dim 128 tiles (128 x 64, micro-tile 8 x 4: 16 x 16 work-items).
 * Forward: the SIMT forward's local-memory reads per FMA. Backward, per
 * product: S and dP read 8 + 4 words per 32 FMAs; dV and dK 4 keys + 8
 * dimensions (128 over 16 rows of work-items) per 32; dQ 8 rows + 8
 * dimensions (128 over 16 columns) per 64. At a quarter word per FMA lane
 * the factor is 4 x the mean over the products each kernel runs. */
FA_TEST(streaming_compute_time) {
    const fa_device_desc *dev = device("nvidia-opencl");
    fa_attention_desc d = shape(4, 4096, 4096, 16, 16, 128, FA_DTYPE_F32);
    fa_kernel_plan kp = tile_plan(FA_VARIANT_SIMT_STREAM, 128, 64, 8, 4);
    const double peak = 132.0 * 1980e6 * 256.0, n = 4096.0;
    const double cells = 4.0 * n * n * 128.0 * 16.0; /* every tile visited, none padded */
    const double s = 12.0 / 32.0, k = 12.0 / 32.0, q = 16.0 / 64.0;

    kp.num_work_groups = 4 * 16 * 32;
    fa_cost f = fa_io_fused(dev, &d, FA_PASS_FORWARD, &kp);
    fa_kernel_plan simt = kp;
    simt.variant = FA_VARIANT_SIMT;
    fa_cost fs = fa_io_fused(dev, &d, FA_PASS_FORWARD, &simt);
    CHECK_NEAR(f.compute_ms, fs.compute_ms, 0.0);
    CHECK(f.hbm_read_bytes == fs.hbm_read_bytes && f.hbm_write_bytes == fs.hbm_write_bytes);

    kp.num_work_groups = 4 * 16 * 64;
    const double waves_kv = 32.0 / (4096.0 / 132.0), waves_q = 16.0 / (2048.0 / 132.0);
    fa_cost b = fa_io_fused(dev, &d, FA_PASS_BACKWARD, &kp);
    double want = 10.0 * cells / (peak / (4.0 * (2 * s + 2 * k + q) / 5.0)) * waves_kv * 1e3;
    CHECK_NEAR(b.compute_ms, want, 1e-9 * want);
    fa_attention_desc det = d;
    det.deterministic = 1;
    fa_cost bd = fa_io_fused(dev, &det, FA_PASS_BACKWARD, &kp);
    want = 8.0 * cells / (peak / (4.0 * (2 * s + 2 * k) / 4.0)) * waves_kv * 1e3 +
           6.0 * cells / (peak / (4.0 * (2 * s + q) / 3.0)) * waves_q * 1e3;
    CHECK_NEAR(bd.compute_ms, want, 1e-9 * want);
    /* Adding dQ with atomics does less work than recomputing P and dP. */
    CHECK(b.compute_ms < bd.compute_ms);
}

/* The pipelines' compute time, by hand, on the H100's figures (4096
 * matrix flops and 16 exponentials a clock and multiprocessor: the
 * exponentials of a head_dim-d score take 4096 / (4 d 16) of its products'
 * forward time). A warpgroup kernel computes a tile's products, then its
 * exponentials: both count. The warp-specialised one with two consumer
 * warpgroups hides the shorter behind the longer. */
FA_TEST(pipelines_and_exponentials) {
    const fa_device_desc *h100 = device("h100");
    const double peak = 132.0 * 1980e6 * 4096.0, sfu = 132.0 * 1980e6 * 16.0;
    for (int dim = 64; dim <= 128; dim += 64) {
        fa_attention_desc d = shape(4, 4096, 4096, 16, 16, dim, FA_DTYPE_BF16);
        fa_kernel_plan kp = tile_plan(FA_VARIANT_WGMMA, 128, 128, 0, 0);
        kp.stages = 2;
        kp.num_work_groups = 132 * 8; /* whole waves */
        const double cells = 4.0 * 4096.0 * 4096.0 * 16.0 * dim;
        const double mma_f = 4.0 * cells / peak * 1e3, exp_f = cells / dim / sfu * 1e3;
        CHECK_NEAR(exp_f / mma_f, 4096.0 / (4.0 * dim * 16.0), 1e-12);
        fa_cost plain = fa_io_fused(h100, &d, FA_PASS_FORWARD, &kp);
        CHECK_NEAR(plain.compute_ms, mma_f + exp_f, 1e-9 * plain.compute_ms);
        kp.variant = FA_VARIANT_WGMMA_TMA;
        kp.work_group_size = 384; /* two consumer warpgroups */
        fa_cost ws = fa_io_fused(h100, &d, FA_PASS_FORWARD, &kp);
        CHECK_NEAR(ws.compute_ms, fmax(mma_f, exp_f), 1e-9 * ws.compute_ms);
        /* The pipeline changes time, not bytes. */
        CHECK(ws.hbm_read_bytes == plain.hbm_read_bytes && ws.hbm_write_bytes == plain.hbm_write_bytes);
        /* Backward: ten flops a cell and dimension against one exponential. */
        kp.bc = 128;
        kp.br = 64;
        fa_cost wb = fa_io_fused(h100, &d, FA_PASS_BACKWARD, &kp);
        kp.work_group_size = 256;
        fa_cost one = fa_io_fused(h100, &d, FA_PASS_BACKWARD, &kp);
        kp.variant = FA_VARIANT_WGMMA;
        fa_cost pb = fa_io_fused(h100, &d, FA_PASS_BACKWARD, &kp);
        const double mma_b = 10.0 * cells / peak * 1e3;
        CHECK_NEAR(wb.compute_ms, fmax(mma_b, exp_f), 1e-9 * wb.compute_ms);
        CHECK_NEAR(pb.compute_ms, mma_b + exp_f, 1e-9 * pb.compute_ms);
        /* One consumer warpgroup has no other to overlap with. */
        CHECK_NEAR(one.compute_ms, pb.compute_ms, 1e-9 * pb.compute_ms);
    }
    /* SIMT kernels count their exponentials among their FMAs' time: their
     * products alone, slowed by the local-memory reads of 4 x 4 micro-tiles
     * (half a word an FMA: a factor of 2). */
    fa_attention_desc d = shape(4, 4096, 4096, 16, 16, 64, FA_DTYPE_F32);
    fa_kernel_plan kp = tile_plan(FA_VARIANT_SIMT, 64, 64, 4, 4);
    kp.num_work_groups = 132 * 16;
    fa_cost c = fa_io_fused(h100, &d, FA_PASS_FORWARD, &kp);
    const double simt = 132.0 * 1980e6 * 256.0;
    CHECK_NEAR(c.compute_ms, 4.0 * 4.0 * 4096.0 * 4096.0 * 16.0 * 64.0 / simt * 1e3 * 2.0, 1e-9 * c.compute_ms);
}

FA_TEST_MAIN(FA_CASE(flops_known_shapes), FA_CASE(causal_flops_half), FA_CASE(visible_fraction_brute_force),
             FA_CASE(visible_fraction_long_sequences), FA_CASE(tile_visits_brute_force),
             FA_CASE(tile_counts_match_the_walk),
             FA_CASE(fused_bytes_scale_n2), FA_CASE(fused_bytes_scale_d2_over_m), FA_CASE(fused_below_standard),
             FA_CASE(standard_bytes_grow_n2), FA_CASE(splitk_partials_cost), FA_CASE(peak_rates_and_roofline),
             FA_CASE(streaming_compute_time), FA_CASE(pipelines_and_exponentials))
