/* Buffer span checks: edges accepted, anything past the end refused, and no
 * wrap-around for offsets near SIZE_MAX. */
#include "harness.h"
#include "span.h"

#include <stdint.h>
#include <string.h>

FA_TEST(spans_within_and_past) {
    CHECK_OK(fa_span_check(0, 16, 16, "upload"));
    CHECK_OK(fa_span_check(16, 0, 16, "upload"));
    CHECK_OK(fa_span_check(4, 12, 16, "upload"));
    CHECK_FAILS(fa_span_check(4, 13, 16, "upload"), FA_ERR_OUT_OF_BOUNDS,
                "upload: offset 4 + bytes 13 exceeds the buffer's 16 bytes");
    CHECK_FAILS(fa_span_check(17, 0, 16, "download"), FA_ERR_OUT_OF_BOUNDS, "download: offset 17");
    /* offset + bytes would wrap to a small number. */
    CHECK_FAILS(fa_span_check(8, SIZE_MAX, 16, "download"), FA_ERR_OUT_OF_BOUNDS, "download");
    CHECK_FAILS(fa_span_check(SIZE_MAX, 2, 16, "download"), FA_ERR_OUT_OF_BOUNDS, "download");
}

FA_TEST_MAIN(FA_CASE(spans_within_and_past))
