/* Ring attention (fa_dist_*) on the CPU reference, its ranks threads of
 * this process: every mask and layout against one context on the whole
 * sequence, dropout drawing the mask one context draws, the cut of a
 * sequence over the ranks, and every rank hearing of another's failure. */
#include "dist_check.h"
#include "dist_split.h"
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

/* Dropout: the ring drops exactly what one context drops on the whole
 * sequence with the same seed, so the two agree as closely as without it.
 * 96 tokens cut into chunks of multiples of 4 for 2, 3 and 4 ranks in
 * both layouts. */
static dist_case dropout_case(int world, fa_cp_layout layout, float p) {
    dist_case c = ref_case(world, layout);
    c.seqlen_q = c.seqlen_k = 96;
    c.dropout_p = p;
    return c;
}

FA_TEST(dropout) {
    const float ps[] = {0.1f, 0.3f};
    for (int i = 0; i < 2; i++)
        for (int w = 2; w <= 4; w++) {
            char what[64];
            dist_case c = dropout_case(w, FA_CP_ZIGZAG, ps[i]);
            c.causal = 1;
            snprintf(what, sizeof what, "dropout %.1f, causal", (double)ps[i]);
            dist_check_expect(what, &c);
            c = dropout_case(w, FA_CP_CONTIGUOUS, ps[i]);
            snprintf(what, sizeof what, "dropout %.1f, no mask", (double)ps[i]);
            dist_check_expect(what, &c);
            /* Shrunk pieces: a window's first visible key of another rank's
             * chunk lies off a multiple of 4 (43 of rank 0's keys for rank
             * 1's first row, contiguous, 2 ranks). */
            c.causal = 1;
            c.window_left = 5;
            snprintf(what, sizeof what, "dropout %.1f, causal window 5", (double)ps[i]);
            dist_check_expect(what, &c);
            c.layout = FA_CP_ZIGZAG;
            c.causal = 0;
            c.window_left = 9;
            c.window_right = 3;
            snprintf(what, sizeof what, "dropout %.1f, window (9, 3)", (double)ps[i]);
            dist_check_expect(what, &c);
        }
}

FA_TEST(dropout_gqa_and_dtypes) {
    const fa_dtype dtypes[] = {FA_DTYPE_F32, FA_DTYPE_BF16};
    for (int i = 0; i < 2; i++)
        for (int w = 2; w <= 4; w++) {
            dist_case c = dropout_case(w, FA_CP_ZIGZAG, 0.3f);
            c.dtype = dtypes[i];
            c.heads_q = 4;
            c.heads_kv = 2;
            c.head_dim = 32;
            c.causal = 1;
            char what[64];
            snprintf(what, sizeof what, "dropout 0.3, GQA 4 on 2, d32, %s", fa_dtype_name(c.dtype));
            dist_check_expect(what, &c);
        }
    /* Queries and keys of different lengths, a block mask, forward alone. */
    dist_case c = dropout_case(2, FA_CP_ZIGZAG, 0.1f);
    c.seqlen_q = 32;
    c.seqlen_k = 64;
    c.causal = 1;
    dist_check_expect("dropout 0.1, causal, 32 queries on 64 keys", &c);
    c = dropout_case(3, FA_CP_CONTIGUOUS, 0.3f);
    c.block_q = 12;
    c.block_k = 6;
    c.causal = 1;
    dist_check_expect("dropout 0.3, causal block mask 12x6", &c);
    c = dropout_case(4, FA_CP_ZIGZAG, 0.3f);
    c.causal = 1;
    c.backward = 0;
    dist_check_expect("dropout 0.3, causal, forward alone", &c);
}

/* fa_dist_plan_set_dropout_seed gives the ring the mask of another seed:
 * that of one context created with it. */
FA_TEST(dropout_reseed) {
    for (int w = 2; w <= 3; w++) {
        dist_case c = dropout_case(w, FA_CP_ZIGZAG, 0.3f);
        c.causal = 1;
        c.reseed = 1;
        dist_check_expect("dropout 0.3, causal, reseeded", &c);
    }
}

static int64_t global_key(const fa_attention_desc *d, fa_cp_layout layout, int world, int source, int64_t key) {
    for (int part = 0; part < (layout == FA_CP_ZIGZAG ? 2 : 1); part++) {
        int64_t start, len, local;
        if (fa_cp_part(layout, d->seqlen_k, world, source, part, &start, &len, &local) != FA_SUCCESS) return -1;
        if (key >= local && key < local + len) return start + key - local;
    }
    return -1;
}

/* With dropout every piece is one cell whose first key lies at a multiple
 * of 4 in the whole sequence, the origin its plan draws from; where a
 * window shrinks a piece its first key moves down to such a multiple, and
 * the ring still matches (FA_TEST(dropout)). */
FA_TEST(dropout_pieces) {
    int moved = 0, pieces = 0;
    for (int z = 0; z < 2; z++)
        for (int w = 1; w <= 4; w++) {
            const fa_cp_layout layout = z ? FA_CP_ZIGZAG : FA_CP_CONTIGUOUS;
            fa_attention_desc d;
            fa_attention_desc_init(&d);
            d.batch = 1;
            d.heads_q = d.heads_kv = 1;
            d.head_dim = 16;
            d.seqlen_q = d.seqlen_k = 96;
            d.causal = 1;
            d.window_left = 5;
            d.dropout_p = 0.2f;
            CHECK_OK(fa_attention_desc_check(&d));
            for (int rank = 0; rank < w; rank++)
                for (int source = 0; source < w; source++) {
                    fa_dist_piece *pc = NULL;
                    int n = 0;
                    CHECK_OK(fa_dist_split(&d, layout, w, rank, source, &pc, &n));
                    for (int i = 0; i < n; i++) {
                        const int64_t first = global_key(&d, layout, w, source, pc[i].key0);
                        const int64_t last = global_key(&d, layout, w, source, pc[i].key0 + pc[i].nkeys - 1);
                        CHECK_MSG(pc[i].drop_col0 == first && first % 4 == 0 && last - first == pc[i].nkeys - 1,
                                  "world %d rank %d keys of %d: piece keys [%lld, +%lld) lie at %lld..%lld, origin "
                                  "column %lld",
                                  w, rank, source, (long long)pc[i].key0, (long long)pc[i].nkeys, (long long)first,
                                  (long long)last, (long long)pc[i].drop_col0);
                        /* A piece that starts inside its chunk was shrunk
                         * and moved: the window's first key is never a
                         * multiple of 4 here (i - 5 for a chunk's first row
                         * at a multiple of 4). */
                        moved += first % (96 / (w * (z + 1))) != 0;
                        pieces++;
                    }
                    fa_dist_pieces_free(pc, n);
                }
        }
    CHECK_MSG(moved > 0, "no piece was shrunk (%d pieces)", pieces);
    printf("%d pieces, %d of them shrunk to a window and moved to a multiple of 4\n", pieces, moved);
}

/* Random shapes, masks and layouts under dropout, every chunk of keys a
 * multiple of 4 long. */
FA_TEST(dropout_random_problems) {
    fa_rng rng;
    fa_rng_seed(&rng, 2027);
    for (int i = 0; i < 40; i++) {
        const int world = 1 + (int)(fa_rng_next(&rng) % 4);
        const fa_cp_layout layout = fa_rng_next(&rng) % 2 ? FA_CP_ZIGZAG : FA_CP_CONTIGUOUS;
        const int unit = layout == FA_CP_ZIGZAG ? 2 * world : world;
        dist_case c = ref_case(world, layout);
        c.dropout_p = fa_rng_next(&rng) % 2 ? 0.1f : 0.3f;
        c.batch = 1 + (int)(fa_rng_next(&rng) % 2);
        c.seqlen_k = 4 * unit * (1 + (int)(fa_rng_next(&rng) % 3));
        c.seqlen_q = fa_rng_next(&rng) % 3 ? c.seqlen_k : unit * (1 + (int)(fa_rng_next(&rng) % (48 / unit + 1)));
        c.causal = (int)(fa_rng_next(&rng) % 2);
        c.window_left = fa_rng_next(&rng) % 2 ? -1 : (int)(fa_rng_next(&rng) % 24);
        c.window_right = fa_rng_next(&rng) % 2 ? -1 : (int)(fa_rng_next(&rng) % 24);
        c.backward = (int)(fa_rng_next(&rng) % 2);
        char what[96];
        snprintf(what, sizeof what, "dropout random %d: %dx%d c%d w(%d,%d) p%.1f", i, c.seqlen_q, c.seqlen_k, c.causal,
                 c.window_left, c.window_right, (double)c.dropout_p);
        dist_check_expect(what, &c);
    }
}

static void other_seed(fa_attention_desc *d) { d->dropout_seed ^= 1; }

FA_TEST(refusals) {
    /* Dropout with variable-length batches: a piece's rows would start at
     * a different position in each sequence. */
    static const int32_t cu[] = {0, 20, 21, 48};
    dist_case c = ref_case(2, FA_CP_CONTIGUOUS);
    c.batch = 3;
    c.seqlen_q = c.seqlen_k = 27;
    c.cu_q = cu;
    c.dropout_p = 0.1f;
    dist_result r = dist_check_run(&c, -1, NULL);
    for (int k = 0; k < 2; k++) {
        CHECK(r.plan_status[k] == FA_ERR_UNSUPPORTED);
        CHECK_MSG(strstr(r.plan_message[k], "dropout with variable-length") != NULL, "%s", r.plan_message[k]);
    }
    /* Chunks of 6 keys (48 over 4 ranks, zigzag): not a multiple of 4. */
    c = ref_case(4, FA_CP_ZIGZAG);
    c.dropout_p = 0.1f;
    r = dist_check_run(&c, -1, NULL);
    for (int k = 0; k < 4; k++) {
        CHECK(r.plan_status[k] == FA_ERR_UNSUPPORTED);
        CHECK_MSG(strstr(r.plan_message[k], "multiple of 4") != NULL && strstr(r.plan_message[k], "chunks of 6"),
                  "%s", r.plan_message[k]);
    }
    /* Ranks with different seeds would draw a mask no one device draws. */
    c = dropout_case(2, FA_CP_ZIGZAG, 0.1f);
    r = dist_check_run(&c, 1, other_seed);
    for (int k = 0; k < 2; k++) {
        CHECK(r.plan_status[k] == FA_ERR_INVALID_ARGUMENT);
        CHECK_MSG(strstr(r.plan_message[k], "disagree") != NULL, "%s", r.plan_message[k]);
    }
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
             FA_CASE(random_problems), FA_CASE(dropout), FA_CASE(dropout_gqa_and_dtypes), FA_CASE(dropout_reseed),
             FA_CASE(dropout_pieces), FA_CASE(dropout_random_problems), FA_CASE(refusals), FA_CASE(explicit_local_strides),
             FA_CASE(every_rank_hears_of_a_failure))
