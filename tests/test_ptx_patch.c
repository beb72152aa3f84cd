/* fa_ptx_unmask_sm90a (core/ptx_patch.c): the masked warpgroup lines of
 * NVIDIA's PTX unmasked and the target moved to sm_90a. */
#include "harness.h"
#include "ptx_patch.h"

#include <stdlib.h>
#include <string.h>

FA_TEST(unmasks_and_retargets) {
    static const char ptx[] = "//\n.version 9.0\n.target sm_90\n.address_size 64\n"
                              "\t// begin inline asm\n\t// @sm_90a wgmma.fence.sync.aligned;\n"
                              "\t// @sm_90a wgmma.commit_group.sync.aligned;\n\t// end inline asm\n"
                              "\tst.global.f32 [%rd1], %f1; // @sm_90 stays\n";
    char *out = NULL;
    size_t n = 0;
    /* With the driver's terminating NUL counted, as CL_PROGRAM_BINARY_SIZES gives it. */
    CHECK_OK(fa_ptx_unmask_sm90a(ptx, sizeof ptx, &out, &n));
    static const char want[] = "//\n.version 9.0\n.target sm_90a\n.address_size 64\n"
                               "\t// begin inline asm\n\twgmma.fence.sync.aligned;\n"
                               "\twgmma.commit_group.sync.aligned;\n\t// end inline asm\n"
                               "\tst.global.f32 [%rd1], %f1; // @sm_90 stays\n";
    CHECK(out != NULL && n == strlen(want) && strcmp(out, want) == 0);
    free(out);
}

FA_TEST(target_already_arch_specific) {
    static const char ptx[] = ".target sm_90a\n// @sm_90a wgmma.fence.sync.aligned;\n";
    char *out = NULL;
    size_t n = 0;
    CHECK_OK(fa_ptx_unmask_sm90a(ptx, sizeof ptx - 1, &out, &n));
    CHECK(out != NULL && strcmp(out, ".target sm_90a\nwgmma.fence.sync.aligned;\n") == 0);
    free(out);
}

FA_TEST(no_target_refused) {
    char *out = (char *)1;
    size_t n = 7;
    CHECK_STATUS(fa_ptx_unmask_sm90a(".version 9.0\n.target sm_80\n", 27, &out, &n), FA_ERR_COMPILE);
    CHECK(out == NULL && n == 0);
    CHECK_STATUS(fa_ptx_unmask_sm90a("", 0, &out, &n), FA_ERR_COMPILE);
    CHECK_STATUS(fa_ptx_unmask_sm90a(NULL, 0, &out, &n), FA_ERR_NULL_POINTER);
}

FA_TEST_MAIN(FA_CASE(unmasks_and_retargets), FA_CASE(target_already_arch_specific), FA_CASE(no_target_refused))
