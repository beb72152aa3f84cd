/* Backend reason strings: formatted, truncated, and copied only where the
 * caller gave room. */
#include "harness.h"
#include "reason.h"

#include <string.h>

FA_TEST(set_formats_and_truncates) {
    char reason[16];
    fa_reason_set(reason, sizeof reason, "%s: %d", "cuInit", 3);
    CHECK(strcmp(reason, "cuInit: 3") == 0);
    fa_reason_set(reason, sizeof reason, "%s", "a loader message longer than the buffer");
    CHECK(strlen(reason) == sizeof reason - 1);
    CHECK(strncmp(reason, "a loader messag", sizeof reason - 1) == 0);
}

FA_TEST(copy_respects_room) {
    char out[8];
    memset(out, 'x', sizeof out);
    fa_reason_copy(out, sizeof out, "no device here");
    CHECK(strcmp(out, "no devi") == 0);
    fa_reason_copy(out, sizeof out, "");
    CHECK(out[0] == '\0');
    /* Callers that do not want the reason pass NULL, 0. */
    fa_reason_copy(NULL, 0, "ignored");
    memset(out, 'x', sizeof out);
    fa_reason_copy(out, 0, "ignored");
    CHECK(out[0] == 'x');
}

FA_TEST_MAIN(FA_CASE(set_formats_and_truncates), FA_CASE(copy_respects_room))
