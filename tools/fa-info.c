/* fa-info: every backend and device this build sees, their queried
 * properties, and the plan for a problem given on the command line (on the
 * devices present, or on devices described by hand with --describe); with
 * --ranks, the ring's predicted steps when the problem's tokens are spread
 * over that many devices. */
#include "cli.h"
#include "cp_model.h"
#include "planner.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The ring options, fa-info's own. */
typedef struct ring_opts {
    int ranks;          /* 1: no ring */
    double link_gbs;    /* 0: the named links */
    double link_us;     /* < 0: the default for link_gbs */
    int layout;         /* -1: zigzag under a causal mask, else contiguous */
} ring_opts;

static int parse_layout(const char *v, int *layout) {
    if (strcmp(v, "zigzag") == 0) *layout = FA_CP_ZIGZAG;
    else if (strcmp(v, "contiguous") == 0) *layout = FA_CP_CONTIGUOUS;
    else return -1;
    return 0;
}

/* Takes the ring options out of argv and leaves the rest to fa_cli_parse. */
static int parse_ring(ring_opts *o, int argc, char **argv, int *rest_argc, char **rest) {
    o->ranks = 1;
    o->link_gbs = 0;
    o->link_us = -1;
    o->layout = -1;
    *rest_argc = 0;
    rest[(*rest_argc)++] = argv[0];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad;
        if (strcmp(a, "--ranks") == 0) bad = !v || fa_cli_int(v, 1, 1 << 20, &o->ranks);
        else if (strcmp(a, "--link-gbs") == 0) bad = !v || fa_cli_double(v, 0, 1e9, &o->link_gbs) || o->link_gbs <= 0;
        else if (strcmp(a, "--link-us") == 0) bad = !v || fa_cli_double(v, 0, 1e9, &o->link_us);
        else if (strcmp(a, "--cp-layout") == 0) bad = !v || parse_layout(v, &o->layout);
        else {
            rest[(*rest_argc)++] = argv[i];
            continue;
        }
        if (bad) {
            fprintf(stderr, "bad or missing value for %s%s%s\n", a, v ? ": " : "", v ? v : "");
            return -1;
        }
        i++;
    }
    rest[*rest_argc] = NULL;
    /* The named links carry latencies of their own; one given alone would
     * silently apply to all three. */
    if (o->link_us >= 0 && o->link_gbs == 0) {
        fprintf(stderr, "--link-us needs --link-gbs (the named links have their own latencies)\n");
        return -1;
    }
    return 0;
}

static void print_ring_on(const fa_device_desc *dev, const fa_attention_desc *desc, const ring_opts *o,
                          const fa_cp_link *link) {
    fa_cp_prediction p;
    if (fa_cp_predict(dev, desc, (fa_cp_layout)o->layout, o->ranks, link, &p) != FA_SUCCESS) {
        printf("    no ring prediction: %s\n", fa_last_error());
        return;
    }
    char text[4096];
    fa_cp_prediction_format(&p, text, sizeof text);
    printf("\n%s", text);
}

static void print_ring(const fa_device_desc *dev, const fa_attention_desc *desc, const ring_opts *o) {
    if (o->ranks <= 1) return;
    if (o->link_gbs > 0) {
        const fa_cp_link link = {"link", o->link_gbs,
                                 o->link_us >= 0 ? o->link_us : fa_cp_default_latency_us(o->link_gbs)};
        print_ring_on(dev, desc, o, &link);
        return;
    }
    for (int i = 0; i < fa_cp_named_link_count(); i++) print_ring_on(dev, desc, o, fa_cp_named_link(i));
}

/* What the plan's text cannot say (fa_plan_info carries no head_dim): the
 * head_dim the warp-specialised kernels are built for where the problem's
 * lies between theirs. */
static void print_built_head_dims(const fa_attention_desc *desc, const fa_plan_info *info) {
    const int fwd = fa_tma_head_dim(desc), bwd = fa_tma_bwd_head_dim(desc);
    if (info->forward.variant == FA_VARIANT_WGMMA_TMA && !info->fp8 && fwd != desc->head_dim)
        printf("forward built for head_dim %d, padded (the tensor maps fill the rest of each row with zeros)\n", fwd);
    if (info->kv_cache || info->fp8 || info->backward.variant != FA_VARIANT_WGMMA_TMA) return;
    if (bwd != desc->head_dim)
        printf("backward built for head_dim %d, padded (the tensor maps fill the rest of each row with zeros)\n", bwd);
    else if (bwd % 64)
        printf("backward built for head_dim %d in tiles of %d columns (the rest zeros, left out of the products)\n",
               bwd, (bwd + 63) / 64 * 64);
}

static void print_plan(const fa_device_desc *dev, const fa_attention_desc *desc) {
    fa_plan_info info;
    memset(&info, 0, sizeof info);
    if (fa_plan_for_device(dev, desc, &info) != FA_SUCCESS) {
        printf("    no plan: %s\n", fa_last_error());
        return;
    }
    char text[4096];
    fa_plan_info_format(&info, text, sizeof text);
    printf("%s", text);
    print_built_head_dims(desc, &info);
    printf("\n");
}

static const char extra_usage[] =
    "fa-info:\n"
    "  --describe KEY      plan for a described device instead of the ones present:\n"
    "                      h100, mi250x, mi300x, arc-a770, nvidia-opencl, pocl-cpu, or all\n"
    "  --ranks W           also predict ring attention over W ranks (context parallelism;\n"
    "                      default 1: none): each step's compute and transfer, the\n"
    "                      efficiency, the local length from which transfers hide\n"
    "  --link-gbs X        the link between ranks, GB/s each direction (default: NVLink 4,\n"
    "                      PCIe 5 x16 and InfiniBand 400G, one table each)\n"
    "  --link-us Y         its latency per transfer, microseconds (default: that of the\n"
    "                      named link closest in bandwidth; needs --link-gbs)\n"
    "  --cp-layout L       zigzag or contiguous (default: zigzag with --causal, else contiguous)\n";

int main(int argc, char **argv) {
    ring_opts ring;
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    int rest_argc = 0;
    if (!rest) {
        fprintf(stderr, "fa-info: out of memory\n");
        return 1;
    }
    fa_cli cli;
    int rc = parse_ring(&ring, argc, argv, &rest_argc, rest) ? -1 : fa_cli_parse(&cli, rest_argc, rest);
    free(rest);
    if (rc != 0) {
        fa_cli_usage(argv[0], extra_usage);
        return rc > 0 ? 0 : 2;
    }
    if (ring.layout < 0) ring.layout = cli.desc.causal ? FA_CP_ZIGZAG : FA_CP_CONTIGUOUS;
    if (ring.ranks > 1 && fa_cp_check(&cli.desc, (fa_cp_layout)ring.layout, ring.ranks) != FA_SUCCESS) {
        fprintf(stderr, "--ranks %d: %s\n", ring.ranks, fa_last_error());
        fa_cli_free(&cli);
        return 2;
    }
    printf("flashattn %s\n\nbackends:\n", fa_version(NULL, NULL, NULL));
    for (int b = 0; b < FA_BACKEND_COUNT; b++) {
        char reason[512];
        fa_status st = fa_backend_get_status((fa_backend)b, reason, sizeof reason);
        printf("  %-9s %s%s%s\n", fa_backend_name((fa_backend)b), st == FA_SUCCESS ? "available" : "unavailable",
               st == FA_SUCCESS ? "" : ": ", st == FA_SUCCESS ? "" : reason);
    }
    char problem[256];
    fa_cli_describe_problem(&cli.desc, problem, sizeof problem);

    if (cli.describe) {
        printf("\nplans for %s on described devices:\n", problem);
        for (int i = 0; i < fa_described_device_count(); i++) {
            const fa_described_device *dd = fa_described_device_get(i);
            if (strcmp(cli.describe, "all") != 0 && strcmp(cli.describe, dd->key) != 0) continue;
            printf("\n[%s] %s\n", dd->key, dd->desc.name);
            print_plan(&dd->desc, &cli.desc);
            print_ring(&dd->desc, &cli.desc, &ring);
        }
        fa_cli_free(&cli);
        return 0;
    }

    int count = 0;
    if (fa_device_count(&count) != FA_SUCCESS) {
        fprintf(stderr, "fa_device_count: %s\n", fa_last_error());
        return 1;
    }
    printf("\ndevices (%d):\n", count);
    for (int i = 0; i < count; i++) {
        fa_device_info info;
        if (fa_device_get_info(i, &info) != FA_SUCCESS) {
            printf("  #%d: %s\n", i, fa_last_error());
            continue;
        }
        int selected = (cli.backend == FA_BACKEND_ANY || cli.backend == info.backend) &&
                       (cli.device < 0 || cli.device == (cli.backend == FA_BACKEND_ANY ? i : info.index));
        printf("[%d]", i);
        fa_cli_print_device(&info);
        if (selected) {
            printf("    plan for %s:\n", problem);
            print_plan(&info.desc, &cli.desc);
            print_ring(&info.desc, &cli.desc, &ring);
        }
    }
    fa_cli_free(&cli);
    return 0;
}
