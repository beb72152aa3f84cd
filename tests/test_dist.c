/* Ring attention (fa_dist_*) on the CPU reference, its ranks threads of
 * this process: every mask and layout against one context on the whole
 * sequence, the cut of a sequence over the ranks, and every rank hearing
 * of another's failure. */
#include "dist_check.h"
#include "harness.h"
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static dist_case ref_case(int world, fa_cp_layout layout) {
    return dist_case_default(FA_BACKEND_REFERENCE, world, layout);
}

FA_TEST(layout_parts) {
    int64_t start, len, local;
    CHECK_OK(fa_cp_part(FA_CP_ZIGZAG, 48, 3, 1, 1, &start, &len, &local));
    CHECK(start == 32 && len == 8 && local == 8);
    CHECK_OK(fa_cp_part(FA_CP_CONTIGUOUS, 48, 3, 2, 0, &start, &len, &local));
    CHECK(start == 32 && len == 16 && local == 0);
    CHECK_FAILS(fa_cp_part(FA_CP_ZIGZAG, 50, 3, 1, 0, &start, &len, &local), FA_ERR_INVALID_SIZE, "50 tokens");
    CHECK_FAILS(fa_cp_part(FA_CP_CONTIGUOUS, 48, 3, 3, 0, &start, &len, &local), FA_ERR_INVALID_ARGUMENT, "rank = 3");
    CHECK_FAILS(fa_cp_part(FA_CP_CONTIGUOUS, 48, 3, 0, 1, &start, &len, &local), FA_ERR_INVALID_ARGUMENT, "part = 1");
    CHECK_FAILS(fa_cp_part(FA_CP_CONTIGUOUS, 48, 0, 0, 0, &start, &len, &local), FA_ERR_INVALID_ARGUMENT, "world = 0");
    /* Scatter then gather over every rank gives the whole tensor back. */
    int whole[2][24], back[2][24], local_part[2][6];
    for (int i = 0; i < 48; i++) whole[i / 24][i % 24] = i;
    memset(back, 0xff, sizeof back);
    for (int r = 0; r < 4; r++) {
        CHECK_OK(fa_cp_scatter(FA_CP_ZIGZAG, 4, r, 2, 24, sizeof(int), whole, local_part));
        CHECK(local_part[0][0] == 3 * r && local_part[0][3] == 3 * (7 - r));
        CHECK_OK(fa_cp_gather(FA_CP_ZIGZAG, 4, r, 2, 24, sizeof(int), local_part, back));
    }
    CHECK(memcmp(whole, back, sizeof whole) == 0);
    CHECK_FAILS(fa_cp_scatter(FA_CP_ZIGZAG, 4, 0, 2, 24, sizeof(int), NULL, local_part), FA_ERR_NULL_POINTER, "NULL");
}

FA_TEST(full_attention) {
    for (int w = 1; w <= 4; w++) {
        dist_case c = ref_case(w, FA_CP_CONTIGUOUS);
        dist_check_expect("no mask, contiguous", &c);
        c.layout = FA_CP_ZIGZAG;
        dist_check_expect("no mask, zigzag", &c);
    }
}

FA_TEST(causal) {
    for (int w = 1; w <= 4; w++) {
        dist_case c = ref_case(w, FA_CP_ZIGZAG);
        c.causal = 1;
        dist_check_expect("causal, zigzag", &c);
        c.layout = FA_CP_CONTIGUOUS;
        dist_check_expect("causal, contiguous", &c);
    }
}

FA_TEST(windows) {
    const int windows[][3] = {{1, 5, -1}, {0, 7, 3}, {0, 0, 0}, {1, 13, 0}, {0, 2, 20}, {1, 30, -1}};
    for (size_t i = 0; i < sizeof windows / sizeof windows[0]; i++)
        for (int w = 2; w <= 4; w += 2)
            for (int z = 0; z < 2; z++) {
                dist_case c = ref_case(w, z ? FA_CP_ZIGZAG : FA_CP_CONTIGUOUS);
                c.causal = windows[i][0];
                c.window_left = windows[i][1];
                c.window_right = windows[i][2];
                char what[64];
                snprintf(what, sizeof what, "%swindow (%d, %d)", c.causal ? "causal " : "", c.window_left,
                         c.window_right);
                dist_check_expect(what, &c);
            }
}

FA_TEST(unequal_lengths) {
    dist_case c = ref_case(2, FA_CP_ZIGZAG);
    c.seqlen_q = 32;
    c.seqlen_k = 64;
    c.causal = 1;
    dist_check_expect("causal, 32 queries on 64 keys", &c);
    c.layout = FA_CP_CONTIGUOUS;
    dist_check_expect("causal, 32 queries on 64 keys", &c);
    /* More queries than keys: the first rows see no key at all. */
    c.seqlen_q = 64;
    c.seqlen_k = 32;
    dist_check_expect("causal, 64 queries on 32 keys (masked rows)", &c);
    c.layout = FA_CP_ZIGZAG;
    c.causal = 0;
    c.window_left = 3;
    c.window_right = 1;
    dist_check_expect("window, 64 queries on 32 keys", &c);
}

FA_TEST(block_mask) {
    const int blocks[][2] = {{8, 8}, {12, 6}, {16, 32}, {5, 7}};
    for (size_t i = 0; i < sizeof blocks / sizeof blocks[0]; i++)
        for (int causal = 0; causal < 2; causal++) {
            dist_case c = ref_case(causal ? 3 : 2, causal ? FA_CP_ZIGZAG : FA_CP_CONTIGUOUS);
            c.block_q = blocks[i][0];
            c.block_k = blocks[i][1];
            c.causal = causal;
            char what[64];
            snprintf(what, sizeof what, "block mask %dx%d%s", c.block_q, c.block_k, causal ? ", causal" : "");
            dist_check_expect(what, &c);
        }
}

FA_TEST(gqa_and_dtypes) {
    const fa_dtype dtypes[] = {FA_DTYPE_F32, FA_DTYPE_F16, FA_DTYPE_BF16};
    for (int i = 0; i < 3; i++) {
        dist_case c = ref_case(2, FA_CP_ZIGZAG);
        c.dtype = dtypes[i];
        c.heads_q = 4;
        c.heads_kv = 2;
        c.head_dim = 32;
        c.causal = 1;
        char what[64];
        snprintf(what, sizeof what, "GQA 4 on 2, d32, %s", fa_dtype_name(c.dtype));
        dist_check_expect(what, &c);
    }
}

FA_TEST(varlen) {
    /* Sequences of 20, 1 and 27 tokens: every border of 2, 3 and 4 ranks
     * cuts one. */
    static const int32_t cu[] = {0, 20, 21, 48};
    for (int w = 2; w <= 4; w++) {
        dist_case c = ref_case(w, FA_CP_CONTIGUOUS);
        c.batch = 3;
        c.seqlen_q = c.seqlen_k = 27;
        c.cu_q = cu;
        dist_check_expect("varlen, no mask", &c);
        c.causal = 1;
        c.layout = FA_CP_ZIGZAG;
        dist_check_expect("varlen, causal", &c);
    }
}

FA_TEST(refusals) {
    dist_case c = ref_case(2, FA_CP_ZIGZAG);
    c.dropout_p = 0.1f;
    dist_result r = dist_check_run(&c, -1, NULL);
    for (int k = 0; k < 2; k++) {
        CHECK(r.plan_status[k] == FA_ERR_UNSUPPORTED);
        CHECK_MSG(strstr(r.plan_message[k], "dropout") != NULL, "%s", r.plan_message[k]);
    }
    static const int32_t cu[] = {0, 20, 21, 48};
    c = ref_case(2, FA_CP_CONTIGUOUS);
    c.batch = 3;
    c.seqlen_q = c.seqlen_k = 27;
    c.cu_q = cu;
    c.window_left = 4;
    r = dist_check_run(&c, -1, NULL);
    for (int k = 0; k < 2; k++) {
        CHECK(r.plan_status[k] == FA_ERR_UNSUPPORTED);
        CHECK_MSG(strstr(r.plan_message[k], "window") != NULL, "%s", r.plan_message[k]);
    }
}

/* Random shapes, masks, layouts and world sizes: the cut of a step into
 * pieces must hold for every combination, not only the ones named above. */
FA_TEST(random_problems) {
    fa_rng rng;
    fa_rng_seed(&rng, 2026);
    int ran = 0;
    for (int i = 0; i < 120; i++) {
        const int world = 1 + (int)(fa_rng_next(&rng) % 4);
        const fa_cp_layout layout = fa_rng_next(&rng) % 2 ? FA_CP_ZIGZAG : FA_CP_CONTIGUOUS;
        const int unit = layout == FA_CP_ZIGZAG ? 2 * world : world;
        dist_case c = ref_case(world, layout);
        c.batch = 1 + (int)(fa_rng_next(&rng) % 2);
        c.seqlen_q = unit * (1 + (int)(fa_rng_next(&rng) % (40 / unit + 1)));
        c.seqlen_k = fa_rng_next(&rng) % 3 ? c.seqlen_q : unit * (1 + (int)(fa_rng_next(&rng) % (40 / unit + 1)));
        c.causal = (int)(fa_rng_next(&rng) % 2);
        c.window_left = fa_rng_next(&rng) % 2 ? -1 : (int)(fa_rng_next(&rng) % 24);
        c.window_right = fa_rng_next(&rng) % 2 ? -1 : (int)(fa_rng_next(&rng) % 24);
        if (fa_rng_next(&rng) % 3 == 0) {
            c.block_q = 1 + (int)(fa_rng_next(&rng) % 16);
            c.block_k = 1 + (int)(fa_rng_next(&rng) % 16);
        }
        c.backward = (int)(fa_rng_next(&rng) % 2);
        char what[96];
        snprintf(what, sizeof what, "random %d: %dx%d c%d w(%d,%d) b%dx%d", i, c.seqlen_q, c.seqlen_k, c.causal,
                 c.window_left, c.window_right, c.block_q, c.block_k);
        dist_check_expect(what, &c);
        ran++;
    }
    CHECK(ran == 120);
}

/* The rank's tensors packed, their strides spelled out rather than 0: the
 * header says the layouts describe the local tensors, so the whole
 * problem's longer sequences must not be checked against them. */
static int explicit_world;
static void spell_out_local_strides(fa_attention_desc *d) {
    const int64_t lq = d->seqlen_q / explicit_world, lk = d->seqlen_k / explicit_world;
    const fa_tensor_desc q = {d->q.dtype, 0, lq * d->heads_q * d->head_dim, (int64_t)d->heads_q * d->head_dim,
                              d->head_dim};
    const fa_tensor_desc k = {d->k.dtype, 0, lk * d->heads_kv * d->head_dim, (int64_t)d->heads_kv * d->head_dim,
                              d->head_dim};
    d->q = d->o = q;
    d->k = d->v = k;
}

FA_TEST(explicit_local_strides) {
    for (int z = 0; z < 2; z++) {
        dist_case c = ref_case(3, z ? FA_CP_ZIGZAG : FA_CP_CONTIGUOUS);
        c.batch = 2;
        c.heads_q = 4;
        c.heads_kv = 2;
        c.causal = z;
        explicit_world = c.world;
        for (int rank = 0; rank < c.world; rank++) {
            const dist_result r = dist_check_run(&c, rank, spell_out_local_strides);
            const double tol = dist_check_tolerance(c.dtype);
            for (int k = 0; k < c.world; k++)
                CHECK_MSG(r.plan_status[k] == FA_SUCCESS && r.pass_status[k] == FA_SUCCESS,
                          "explicit strides on rank %d: rank %d: %s: %s", rank, k, fa_status_string(r.plan_status[k]),
                          r.plan_message[k]);
            CHECK_MSG(r.err_o <= tol && r.err_lse <= tol && r.err_dq <= tol && r.err_dk <= tol && r.err_dv <= tol,
                      "explicit strides on rank %d: O %.3g, L %.3g, dQ %.3g, dK %.3g, dV %.3g", rank, r.err_o,
                      r.err_lse, r.err_dq, r.err_dk, r.err_dv);
        }
    }
}

static void other_head_dim(fa_attention_desc *d) { d->head_dim = 24; }
static void bad_length(fa_attention_desc *d) { d->seqlen_q = d->seqlen_k = 50; }

FA_TEST(every_rank_hears_of_a_failure) {
    dist_case c = ref_case(3, FA_CP_ZIGZAG);
    dist_result r = dist_check_run(&c, 1, other_head_dim);
    for (int k = 0; k < 3; k++) {
        CHECK(r.plan_status[k] == FA_ERR_INVALID_ARGUMENT);
        CHECK_MSG(strstr(r.plan_message[k], "disagree") != NULL, "rank %d: %s", k, r.plan_message[k]);
    }
    r = dist_check_run(&c, 2, bad_length);
    CHECK(r.plan_status[2] == FA_ERR_INVALID_SIZE);
    for (int k = 0; k < 2; k++) {
        CHECK(r.plan_status[k] == FA_ERR_INVALID_SIZE);
        CHECK_MSG(strstr(r.plan_message[k], "rank 2 failed") != NULL, "rank %d: %s", k, r.plan_message[k]);
    }
}

FA_TEST_MAIN(FA_CASE(layout_parts), FA_CASE(full_attention), FA_CASE(causal), FA_CASE(windows),
             FA_CASE(unequal_lengths), FA_CASE(block_mask), FA_CASE(gqa_and_dtypes), FA_CASE(varlen),
             FA_CASE(random_problems), FA_CASE(refusals), FA_CASE(explicit_local_strides),
             FA_CASE(every_rank_hears_of_a_failure))
