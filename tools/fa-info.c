/* fa-info: every backend and device this build sees, their queried
 * properties, and the plan for a problem given on the command line (on the
 * devices present, or on devices described by hand with --describe). */
#include "cli.h"
#include "planner.h"

#include <stdio.h>
#include <string.h>

static void print_plan(const fa_device_desc *dev, const fa_attention_desc *desc) {
    fa_plan_info info;
    memset(&info, 0, sizeof info);
    if (fa_plan_for_device(dev, desc, &info) != FA_SUCCESS) {
        printf("    no plan: %s\n", fa_last_error());
        return;
    }
    char text[4096];
    fa_plan_info_format(&info, text, sizeof text);
    printf("%s\n", text);
}

static const char extra_usage[] =
    "fa-info:\n"
    "  --describe KEY      plan for a described device instead of the ones present:\n"
    "                      h100, mi250x, mi300x, arc-a770, nvidia-opencl, pocl-cpu, or all\n";

int main(int argc, char **argv) {
    fa_cli cli;
    int rc = fa_cli_parse(&cli, argc, argv);
    if (rc != 0) {
        fa_cli_usage(argv[0], extra_usage);
        return rc > 0 ? 0 : 2;
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
        }
    }
    fa_cli_free(&cli);
    return 0;
}
