/* The command-line tools (fa-info, fa-run, fa-bench) parse strictly: every
 * malformed, out-of-range or unknown value exits 2 with a message naming
 * the option (issue 21, problem 7), and the largest problems plan at once.
 * The tools are run as programs from the build folder. */
#include "harness.h"
#include "test_util.h"

#include <stdint.h>
#include <stdlib.h>
#include <time.h>

static double seconds_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static char output[1 << 16];

/* The tool exits 2 and says which option is wrong. */
static void expect_refused(const char *tool, const char *const *args, const char *needle) {
    const int rc = fa_test_run_tool(tool, args, output, sizeof output, 120.0);
    CHECK_MSG(rc == 2, "%s %s %s: exit %d, expected 2; output:\n%s", tool, args[0], args[1] ? args[1] : "", rc,
              output);
    CHECK_MSG(strstr(output, needle) != NULL, "%s %s %s: output lacks \"%s\":\n%s", tool, args[0],
              args[1] ? args[1] : "", needle, output);
}

FA_TEST(bad_options_exit_2) {
    setenv("FLASHATTN_NO_BANDWIDTH_PROBE", "1", 1);
    /* The list, then more of the same kinds. */
    static const char *const bad[][3] = {
        {"--scale", "abc", "--scale"},        {"--dropout", "abc", "--dropout"},
        {"--seed", "x", "--seed"},            {"--heads-kv", "0", "--heads-kv"},
        {"--heads-kv", "-5", "--heads-kv"},   {"--device", "-7", "--device"},
        {"--window", "3,4,5", "--window"},    {"--window", "2147483648,1", "--window"},
        {"--window", "3", "--window"},        {"--window", "3,x", "--window"},
        {"--seed", "-1", "--seed"},           {"--seed", "99999999999999999999", "--seed"},
        {"--batch", "1x", "--batch"},         {"--batch", " 5", "--batch"},
        {"--batch", "0", "--batch"},          {"--seqlen", "2147483648", "--seqlen"},
        {"--seqlen-k", "-1", "--seqlen-k"},   {"--heads", "", "--heads"},
        {"--dim", "12", "head_dim"},          {"--dim", "1000", "--dim"},
        {"--dropout", "1", "--dropout"},      {"--dropout", "-0.1", "--dropout"},
        {"--scale", "nan", "--scale"},        {"--scale", "-1", "--scale"},
        {"--scale", "1e39", "--scale"},       {"--dtype", "fp64", "--dtype"},
        {"--backend", "vulkan", "--backend"}, {"--block-sparse", "0,0.5", "--block-sparse"},
        {"--block-sparse", "8,1.5", "--block-sparse"}, {"--block-sparse", "8", "--block-sparse"},
        {"--repeats", "0", "--repeats"},      {"--device", "100000", "--device"},
        {"--bogus", "1", "--bogus"},          {"--heads", "6", "heads_kv"},
        {"--softcap", "0", "--softcap"},      {"--softcap", "-2", "--softcap"},
        {"--softcap", "inf", "--softcap"},    {"--softcap", "1e39", "--softcap"},
        {"--bias", "fp64", "--bias"},         {"--bias", "fp16", "bias.dtype"}};
    static const char *const tools[] = {"fa-info", "fa-run", "fa-bench"};
    int runs = 0;
    for (size_t t = 0; t < sizeof tools / sizeof tools[0]; t++)
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            /* --heads is fa-bench's own option (heads of its sweep). */
            if (t == 2 && strcmp(bad[i][0], "--heads") == 0) continue;
            const char *args[5] = {bad[i][0], bad[i][1], NULL, NULL, NULL};
            if (strcmp(bad[i][1], "6") == 0) {
                args[2] = "--heads-kv";
                args[3] = "4";
            }
            expect_refused(tools[t], args, bad[i][2]);
            runs++;
        }
    CHECK(runs > 90);
    /* A missing value and an unknown described device. */
    expect_refused("fa-info", (const char *const[]){"--seqlen", NULL}, "--seqlen");
    expect_refused("fa-info", (const char *const[]){"--describe", "nonexistent", NULL}, "nonexistent");
    expect_refused("fa-info", (const char *const[]){"--device", "5", "--backend", "reference", NULL}, "--device 5");
}

FA_TEST(good_options_run) {
    setenv("FLASHATTN_NO_BANDWIDTH_PROBE", "1", 1);
    int rc = fa_test_run_tool("fa-info",
                              (const char *const[]){"--describe", "h100", "--window", "-1,2147483647", "--seed",
                                                    "0xffffffffffffffff", "--scale", "0.125", "--dropout", "0.5",
                                                    "--block-sparse", "64,0.5", NULL},
                              output, sizeof output, 120.0);
    CHECK_MSG(rc == 0, "fa-info with good options: exit %d:\n%s", rc, output);
    rc = fa_test_run_tool("fa-info", (const char *const[]){"--device", "0", "--backend", "reference", NULL}, output,
                          sizeof output, 120.0);
    CHECK_MSG(rc == 0 && strstr(output, "plan for") != NULL, "fa-info --device 0: exit %d:\n%s", rc, output);
    /* One token: the reference gradients dQ and dK are zero; the check is
     * relative plus absolute, so they pass. */
    rc = fa_test_run_tool("fa-run", (const char *const[]){"--backend", "reference", "--seqlen", "1", "--repeats", "1",
                                                          NULL},
                          output, sizeof output, 120.0);
    CHECK_MSG(rc == 0 && strstr(output, "PASS") != NULL, "fa-run --seqlen 1: exit %d:\n%s", rc, output);
    /* The score options, checked against the reference (the bias a buffer
     * of the pass). */
    rc = fa_test_run_tool("fa-run",
                          (const char *const[]){"--backend", "reference", "--seqlen", "48", "--dim", "16", "--causal",
                                                "--softcap", "3", "--alibi", "--bias", "fp32", "--repeats", "1", NULL},
                          output, sizeof output, 120.0);
    CHECK_MSG(rc == 0 && strstr(output, "PASS") && strstr(output, "softcap=3 alibi bias=fp32"),
              "fa-run with score options: exit %d:\n%s", rc, output);
}

/* fa-info's ring options: their values as strictly as the others', and
 * problems the ring cannot cut refused by name before anything prints. */
FA_TEST(ring_options_refused) {
    setenv("FLASHATTN_NO_BANDWIDTH_PROBE", "1", 1);
    static const char *const bad[][2] = {
        {"--ranks", "0"},      {"--ranks", "-2"},        {"--ranks", "x"},           {"--ranks", "4 "},
        {"--ranks", "2097152"}, {"--link-gbs", "0"},     {"--link-gbs", "-5"},       {"--link-gbs", "nan"},
        {"--link-gbs", "inf"}, {"--link-gbs", "1e10"},   {"--link-gbs", "fast"},     {"--link-us", "-1"},
        {"--link-us", "x"},    {"--cp-layout", "ring"},  {"--cp-layout", ""}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char needle[64];
        snprintf(needle, sizeof needle, "value for %s", bad[i][0]);
        expect_refused("fa-info", (const char *const[]){"--describe", "h100", bad[i][0], bad[i][1], NULL}, needle);
    }
    expect_refused("fa-info", (const char *const[]){"--ranks", NULL}, "value for --ranks");
    expect_refused("fa-info", (const char *const[]){"--describe", "h100", "--link-us", "2", NULL},
                   "--link-us needs --link-gbs");
    /* 3 ranks do not divide 512 tokens; 4 zigzag ranks (8 chunks) not 516. */
    expect_refused("fa-info", (const char *const[]){"--describe", "h100", "--ranks", "3", NULL}, "seqlen_q = 512");
    expect_refused("fa-info", (const char *const[]){"--describe", "h100", "--ranks", "4", "--seqlen", "516",
                                                    "--causal", NULL},
                   "not a multiple of 8");
    expect_refused("fa-info", (const char *const[]){"--describe", "h100", "--ranks", "2", "--window", "16,0", NULL},
                   "window");
    expect_refused("fa-info", (const char *const[]){"--describe", "h100", "--ranks", "2", "--causal", "--seqlen-k",
                                                    "256", NULL},
                   "seqlen_k = 256");
    /* A bad shared option still names itself with the ring options around. */
    expect_refused("fa-info", (const char *const[]){"--ranks", "2", "--dim", "12", NULL}, "head_dim");
}

static int count_of(const char *text, const char *needle) {
    int n = 0;
    for (const char *p = strstr(text, needle); p; p = strstr(p + 1, needle)) n++;
    return n;
}

FA_TEST(ring_options_run) {
    setenv("FLASHATTN_NO_BANDWIDTH_PROBE", "1", 1);
    /* No --link-gbs: the three named links, zigzag under the causal mask. */
    int rc = fa_test_run_tool("fa-info",
                              (const char *const[]){"--describe", "h100", "--ranks", "4", "--causal", "--seqlen",
                                                    "8192", "--dtype", "bf16", "--heads", "32", "--heads-kv", "8",
                                                    "--dim", "128", NULL},
                              output, sizeof output, 120.0);
    CHECK_MSG(rc == 0 && count_of(output, "ring over 4 ranks (zigzag layout)") == 3 &&
                  strstr(output, "NVLink 4: 450 GB/s") && strstr(output, "PCIe 5 x16: 63 GB/s") &&
                  strstr(output, "InfiniBand 400G: 50 GB/s") && count_of(output, "transfers hide") == 3,
              "exit %d:\n%s", rc, output);
    /* A link of one's own: one table; contiguous without a mask. */
    rc = fa_test_run_tool("fa-info",
                          (const char *const[]){"--describe", "all", "--ranks", "2", "--link-gbs", "100", "--link-us",
                                                "4", NULL},
                          output, sizeof output, 120.0);
    CHECK_MSG(rc == 0 && count_of(output, "ring over 2 ranks (contiguous layout), link: 100 GB/s a direction, 4 us") ==
                             count_of(output, "\n["),
              "exit %d:\n%s", rc, output);
    /* Latency from the nearest named link; the layout as asked. */
    rc = fa_test_run_tool("fa-info",
                          (const char *const[]){"--describe", "mi300x", "--ranks", "8", "--link-gbs", "400",
                                                "--cp-layout", "contiguous", "--causal", NULL},
                          output, sizeof output, 120.0);
    CHECK_MSG(rc == 0 && strstr(output, "ring over 8 ranks (contiguous layout), link: 400 GB/s a direction, 2 us") &&
                  strstr(output, "0-100%"),
              "exit %d:\n%s", rc, output);
    /* One rank, the default: nothing of the ring, whatever the link. */
    rc = fa_test_run_tool("fa-info", (const char *const[]){"--describe", "h100", "--link-gbs", "10", NULL}, output,
                          sizeof output, 120.0);
    CHECK_MSG(rc == 0 && !strstr(output, "ring over"), "exit %d:\n%s", rc, output);
    /* The devices present: the reference plans, so the ring is predicted too. */
    rc = fa_test_run_tool("fa-info",
                          (const char *const[]){"--backend", "reference", "--device", "0", "--ranks", "2",
                                                "--link-gbs", "25", NULL},
                          output, sizeof output, 120.0);
    CHECK_MSG(rc == 0 && strstr(output, "ring over 2 ranks"), "exit %d:\n%s", rc, output);
}

/* fa-bench --decode: malformed lists and paged caches are refused; a step
 * against a short cache runs on the reference (no copy to compare with). */
FA_TEST(bench_decode_options) {
    setenv("FLASHATTN_NO_BANDWIDTH_PROBE", "1", 1);
    expect_refused("fa-bench", (const char *const[]){"--decode", "--page-size", "512", NULL}, "--page-size");
    expect_refused("fa-bench", (const char *const[]){"--decode", "--append", "x", NULL}, "--append");
    expect_refused("fa-bench", (const char *const[]){"--decode", "--rotary", NULL}, "--rotary");
    expect_refused("fa-bench", (const char *const[]){"--decode", "--batch", "1,x", NULL}, "--batch");
    expect_refused("fa-bench", (const char *const[]){"--decode", "--cache", "0", NULL}, "--cache");
    expect_refused("fa-bench", (const char *const[]){"--decode", "--seqlen-k", "5", NULL}, "--cache");
    expect_refused("fa-bench", (const char *const[]){"--decode", "--dim", "12", NULL}, "head_dim");
    const char *csv = "/tmp/fa-test-bench-decode.csv";
    remove(csv);
    int rc = fa_test_run_tool("fa-bench",
                              (const char *const[]){"--decode", "--backend", "reference", "--batch", "1,2", "--cache",
                                                    "40", "--heads", "4", "--heads-kv", "2", "--dim", "16", "--dtype",
                                                    "bf16", "--repeats", "1", "--csv", csv, NULL},
                              output, sizeof output, 120.0);
    CHECK_MSG(rc == 0 && strstr(output, "seqlen_q 1, heads 4 on 2 KV heads") != NULL, "exit %d:\n%s", rc, output);
    FILE *f = fopen(csv, "r");
    CHECK(f != NULL);
    if (f) {
        char line[512];
        int lines = 0;
        while (fgets(line, sizeof line, f)) lines++;
        fclose(f);
        CHECK_MSG(lines == 3, "%d lines in the CSV", lines); /* header and two points */
    }
    remove(csv);
    /* A KV-cache step: paged, appending, rotary. */
    rc = fa_test_run_tool("fa-bench",
                          (const char *const[]){"--decode", "--backend", "reference", "--batch", "2", "--cache", "40",
                                                "--heads", "4", "--heads-kv", "2", "--dim", "16", "--page-size", "16",
                                                "--append", "2", "--rotary", "8", "--repeats", "1", "--csv", csv, NULL},
                          output, sizeof output, 120.0);
    CHECK_MSG(rc == 0 && strstr(output, "paged cache (16-token pages") && strstr(output, "fa_forward_kvcache") &&
                  strstr(output, "seqlen_q 2"),
              "exit %d:\n%s", rc, output);
    f = fopen(csv, "r");
    CHECK(f != NULL);
    if (f) {
        char header[512], row[512];
        CHECK(fgets(header, sizeof header, f) && strstr(header, ",api,page_size,append,rotary"));
        CHECK(fgets(row, sizeof row, f) && strstr(row, ",kvcache,16,2,8"));
        fclose(f);
    }
    remove(csv);
}

/* Problem 4: fa-info planning 2 x 10^9 tokens did not finish in a minute. */
FA_TEST(largest_problem_answers_at_once) {
    setenv("FLASHATTN_NO_BANDWIDTH_PROBE", "1", 1);
    double t0 = seconds_now();
    int rc = fa_test_run_tool("fa-info",
                              (const char *const[]){"--seqlen", "1000000000", "--batch", "2", "--dim", "64",
                                                    "--describe", "all", NULL},
                              output, sizeof output, 120.0);
    const double described = seconds_now() - t0;
    CHECK_MSG(rc == 0 && strstr(output, "[pocl-cpu]") != NULL, "exit %d:\n%s", rc, output);
    CHECK_MSG(described < 10.0, "planning on the described devices took %.1f s", described);
    t0 = seconds_now();
    rc = fa_test_run_tool("fa-info",
                          (const char *const[]){"--seqlen", "1000000000", "--batch", "2", "--dim", "64", NULL}, output,
                          sizeof output, 120.0);
    CHECK_MSG(rc == 0 && strstr(output, "plan for") != NULL, "exit %d:\n%s", rc, output);
    fprintf(stderr, "  fa-info 2 x 10^9 tokens: %.2f s on the described devices, %.2f s on those present\n", described,
            seconds_now() - t0);
}

/* fa-run's check, relative plus absolute (tests/test_util.h). */
FA_TEST(check_tolerance) {
    float zero[4] = {0, 0, 0, 0}, tiny[4] = {1e-7f, -2e-7f, 0, 5e-8f}, big[4] = {1e-3f, 0, 0, 0};
    fa_test_diff d = fa_test_compare(tiny, zero, FA_DTYPE_F32, 4);
    CHECK(d.ref_norm == 0.0 && d.diff_norm > 0.0 && d.mismatched == 0);
    CHECK(fa_test_within(&d, 1e-5));
    d = fa_test_compare(big, zero, FA_DTYPE_F32, 4);
    CHECK(!fa_test_within(&d, 1e-5));
    float ref[4] = {1, 2, -INFINITY, NAN}, got[4] = {1, 2.00001f, -INFINITY, NAN};
    d = fa_test_compare(got, ref, FA_DTYPE_F32, 4);
    CHECK(d.mismatched == 0 && d.finite == 2 && fa_test_within(&d, 1e-5));
    got[2] = 0;
    d = fa_test_compare(got, ref, FA_DTYPE_F32, 4);
    CHECK(d.mismatched == 1 && !fa_test_within(&d, 1e-5));
    got[2] = -INFINITY;
    got[3] = 0;
    CHECK(fa_test_compare(got, ref, FA_DTYPE_F32, 4).mismatched == 1);
    got[3] = NAN;
    got[0] = NAN;
    CHECK(fa_test_compare(got, ref, FA_DTYPE_F32, 4).mismatched == 1);
}

/* fa-info says which head_dim the warp-specialised kernels are built for
 * where the plan's text cannot (it carries no head_dim): 160 padded to 192
 * both ways, 96's backward in 128's tiles, nothing at 128. */
FA_TEST(info_names_built_head_dims) {
    setenv("FLASHATTN_NO_BANDWIDTH_PROBE", "1", 1);
    static const char *const dims[] = {"160", "96", "128"};
    for (int i = 0; i < 3; i++) {
        const int rc = fa_test_run_tool("fa-info",
                                        (const char *const[]){"--describe", "h100", "--dtype", "bf16", "--dim", dims[i],
                                                              "--seqlen", "4096", "--batch", "2", NULL},
                                        output, sizeof output, 120.0);
        const int built = count_of(output, "built for head_dim");
        CHECK_MSG(rc == 0 && (i == 0   ? strstr(output, "forward built for head_dim 192, padded") &&
                                           strstr(output, "backward built for head_dim 192, padded")
                              : i == 1 ? strstr(output, "backward built for head_dim 96 in tiles of 128 columns") &&
                                             built == 2
                                       : built == 0),
                  "--dim %s: exit %d:\n%s", dims[i], rc, output);
    }
}

FA_TEST_MAIN(FA_CASE(bad_options_exit_2), FA_CASE(ring_options_refused), FA_CASE(ring_options_run),
             FA_CASE(bench_decode_options), FA_CASE(good_options_run),
             FA_CASE(largest_problem_answers_at_once), FA_CASE(check_tolerance), FA_CASE(info_names_built_head_dims))
