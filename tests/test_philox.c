/* Philox4x32-10 and the dropout mask built on it. */
#include "harness.h"
#include "philox.h"
#include "test_util.h"

#include <math.h>
#include <stdint.h>

/* Random123's published known-answer vectors (tests/kat_vectors, the
 * "philox4x32 10" rows): counter[4], key[2], expected output[4]. */
static const uint32_t kat_vectors[3][10] = {
    {0x00000000u, 0x00000000u, 0x00000000u, 0x00000000u, 0x00000000u, 0x00000000u,
     0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u},
    {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu,
     0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu},
    {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u,
     0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u},
};

FA_TEST(known_answer_vectors) {
    for (int row = 0; row < 3; row++) {
        const uint32_t *kat = kat_vectors[row];
        fa_philox_u32x4 counter = {{kat[0], kat[1], kat[2], kat[3]}};
        fa_philox_u32x4 out = fa_philox4x32_10(counter, kat[4], kat[5]);
        for (int lane = 0; lane < 4; lane++)
            CHECK_MSG(out.v[lane] == kat[6 + lane], "vector %d lane %d: got %08x, expected %08x", row,
                      lane, (unsigned)out.v[lane], (unsigned)kat[6 + lane]);
    }
}

static int rand_int(fa_rng *rng, int n) { return (int)(fa_rng_next(rng) % (uint64_t)n); }

/* fa_dropout_random is exactly the documented key, counter and lane. */
FA_TEST(element_word_follows_definition) {
    fa_rng rng;
    fa_rng_seed(&rng, 0x9417);
    int bad = 0;
    for (int n = 0; n < 20000; n++) {
        uint64_t seed = fa_rng_next(&rng), offset = fa_rng_next(&rng);
        int heads_q = 1 + rand_int(&rng, 64);
        int batch = rand_int(&rng, 512), head = rand_int(&rng, heads_q);
        int row = rand_int(&rng, 1 << 20), col = rand_int(&rng, 1 << 20);
        uint32_t key0 = (uint32_t)(seed & 0xffffffffu);
        uint32_t key1 = (uint32_t)((seed >> 32) + (offset >> 32));
        fa_philox_u32x4 counter = {{(uint32_t)(col / 4), (uint32_t)row,
                                    (uint32_t)(batch * heads_q + head),
                                    (uint32_t)(offset & 0xffffffffu)}};
        uint32_t expect = fa_philox4x32_10(counter, key0, key1).v[col % 4];
        if (fa_dropout_random(seed, offset, batch, head, heads_q, row, col) != expect) bad++;
    }
    CHECK_MSG(bad == 0, "%d of 20000 words differ from the documented definition", bad);
    /* Four neighbouring columns share one Philox call, one lane each. */
    fa_philox_u32x4 counter = {{5, 7, 2 * 3 + 1, 0x89abcdefu}};
    fa_philox_u32x4 block = fa_philox4x32_10(counter, 0x01234567u, 0x00000011u + 0x00000022u);
    for (int lane = 0; lane < 4; lane++)
        CHECK(fa_dropout_random(0x0000001101234567ull, 0x0000002289abcdefull, 2, 1, 3, 7, 20 + lane) ==
              block.v[lane]);
}

FA_TEST(threshold_values) {
    CHECK(fa_dropout_threshold(0.0f) == 0u);
    CHECK(fa_dropout_threshold(0.5f) == 0x80000000u);
    CHECK(fa_dropout_threshold(0.25f) == 0x40000000u);
    /* 0.1f is 13421773 * 2^-27, so p * 2^32 = 13421773 * 32 exactly. */
    CHECK(fa_dropout_threshold(0.1f) == 0x199999a0u);
    /* The float just below 1 is 1 - 2^-24: threshold 2^32 - 2^8. */
    CHECK(fa_dropout_threshold(nextafterf(1.0f, 0.0f)) == 0xffffff00u);
    CHECK(fa_dropout_threshold(1.0f) == 0xffffffffu);
    CHECK(fa_dropout_threshold(-0.5f) == 0u);

    /* p = 0 keeps everything, p just below 1 keeps about 2^-24 of them. */
    fa_rng rng;
    fa_rng_seed(&rng, 0x7e5);
    uint64_t seed = fa_rng_next(&rng), offset = fa_rng_next(&rng);
    int kept_zero = 0, kept_high = 0, mismatch = 0, total = 0;
    float high = nextafterf(1.0f, 0.0f);
    for (int b = 0; b < 2; b++)
        for (int h = 0; h < 4; h++)
            for (int i = 0; i < 64; i++)
                for (int j = 0; j < 256; j++) {
                    total++;
                    kept_zero += fa_dropout_keep(seed, offset, 0.0f, b, h, 4, i, j);
                    kept_high += fa_dropout_keep(seed, offset, high, b, h, 4, i, j);
                    int expect = fa_dropout_random(seed, offset, b, h, 4, i, j) >= fa_dropout_threshold(0.3f);
                    if (fa_dropout_keep(seed, offset, 0.3f, b, h, 4, i, j) != expect) mismatch++;
                }
    CHECK(kept_zero == total);
    CHECK_MSG(kept_high <= 3, "p = 1 - 2^-24 kept %d of %d", kept_high, total);
    CHECK(mismatch == 0);
}

FA_TEST(keep_fraction_matches_p) {
    fa_rng rng;
    fa_rng_seed(&rng, 0x5eed);
    const float ps[] = {0.1f, 0.3f, 0.5f, 0.9f};
    for (size_t t = 0; t < sizeof ps / sizeof ps[0]; t++) {
        uint64_t seed = fa_rng_next(&rng), offset = fa_rng_next(&rng);
        long kept = 0, total = 0;
        for (int b = 0; b < 2; b++)
            for (int h = 0; h < 4; h++)
                for (int i = 0; i < 128; i++)
                    for (int j = 0; j < 256; j++) {
                        kept += fa_dropout_keep(seed, offset, ps[t], b, h, 4, i, j);
                        total++;
                    }
        double frac = (double)kept / (double)total;
        double p = (double)ps[t];
        double sigma = sqrt(p * (1 - p) / (double)total);
        CHECK_MSG(fabs(frac - (1 - p)) < 5 * sigma, "p = %g: kept fraction %.5f, expected %.5f +- %.5f", p,
                  frac, 1 - p, 5 * sigma);
    }
}

/* Fraction of equal bits between two words, accumulated. */
static int equal_bits(uint32_t a, uint32_t b) {
    uint32_t same = ~(a ^ b);
    int n = 0;
    while (same) {
        n += (int)(same & 1u);
        same >>= 1;
    }
    return n;
}

FA_TEST(word_depends_on_element_only) {
    fa_rng rng;
    fa_rng_seed(&rng, 0xc0de);
    enum { SAMPLES = 20000 };
    /* Neighbours along each coordinate, and other seeds and offsets. */
    long equal_words[8] = {0}, bits[8] = {0};
    long both_kept[8] = {0};
    int repeat_bad = 0;
    for (int n = 0; n < SAMPLES; n++) {
        uint64_t seed = fa_rng_next(&rng), offset = fa_rng_next(&rng);
        int hq = 8, b = rand_int(&rng, 16), h = rand_int(&rng, hq - 1);
        int i = rand_int(&rng, 4096), j = rand_int(&rng, 4096);
        uint32_t w = fa_dropout_random(seed, offset, b, h, hq, i, j);
        /* Same element, same word, whatever was computed in between. */
        if (fa_dropout_random(seed, offset, b, h, hq, i, j) != w) repeat_bad++;
        uint32_t other[8] = {
            fa_dropout_random(seed, offset, b + 1, h, hq, i, j),
            fa_dropout_random(seed, offset, b, h + 1, hq, i, j),
            fa_dropout_random(seed, offset, b, h, hq, i + 1, j),
            fa_dropout_random(seed, offset, b, h, hq, i, j ^ 1),       /* same Philox call */
            fa_dropout_random(seed, offset, b, h, hq, i, (j | 3) + 1), /* next call */
            fa_dropout_random(seed ^ 1, offset, b, h, hq, i, j),
            fa_dropout_random(seed, offset + 1, b, h, hq, i, j),
            fa_dropout_random(seed, offset + (1ull << 32), b, h, hq, i, j),
        };
        for (int c = 0; c < 8; c++) {
            equal_words[c] += other[c] == w;
            bits[c] += equal_bits(other[c], w);
            both_kept[c] += (w >= 0x80000000u) && (other[c] >= 0x80000000u);
        }
    }
    static const char *const what[8] = {"batch", "head", "row", "col (same call)", "col (next call)",
                                        "seed", "offset", "offset high word"};
    CHECK(repeat_bad == 0);
    for (int c = 0; c < 8; c++) {
        /* Independent words agree on half their bits and are jointly kept
         * (p = 0.5) a quarter of the time. */
        double bit_frac = (double)bits[c] / (32.0 * SAMPLES);
        double joint = (double)both_kept[c] / SAMPLES;
        CHECK_MSG(equal_words[c] == 0, "%s: %ld equal words", what[c], equal_words[c]);
        CHECK_MSG(fabs(bit_frac - 0.5) < 0.005, "%s: bits agree %.4f of the time", what[c], bit_frac);
        CHECK_MSG(fabs(joint - 0.25) < 0.015, "%s: jointly kept %.4f of the time", what[c], joint);
    }
    /* Every (batch, head) pair of a problem gets its own stream. */
    uint32_t words[16 * 8];
    for (int b = 0; b < 16; b++)
        for (int h = 0; h < 8; h++) words[b * 8 + h] = fa_dropout_random(42, 7, b, h, 8, 3, 5);
    int collisions = 0;
    for (int a = 0; a < 128; a++)
        for (int c = a + 1; c < 128; c++) collisions += words[a] == words[c];
    CHECK(collisions == 0);
}

FA_TEST_MAIN(FA_CASE(known_answer_vectors), FA_CASE(element_word_follows_definition),
             FA_CASE(threshold_values), FA_CASE(keep_fraction_matches_p),
             FA_CASE(word_depends_on_element_only))
