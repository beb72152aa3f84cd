/* The CUBIN reader behind the CUDA compile reports: registers and stack
 * frame of a kernel from a small ELF image built here with the layout
 * NVIDIA's binaries use, and no read outside the image whatever its
 * length or contents (the sanitizer build checks that). */
#include "harness.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef FA_WITH_CUDA
#include "backends/cuda/cubin_info.h"

typedef struct image {
    uint8_t b[1024];
    size_t n;
} image;

static void put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static void put32(uint8_t *p, uint32_t v) {
    put16(p, (uint16_t)v);
    put16(p + 2, (uint16_t)(v >> 16));
}
static void put64(uint8_t *p, uint64_t v) {
    put32(p, (uint32_t)v);
    put32(p + 4, (uint32_t)(v >> 32));
}
static size_t append(image *im, const void *data, size_t n) {
    size_t at = (im->n + 7) & ~(size_t)7;
    memcpy(im->b + at, data, n);
    im->n = at + n;
    return at;
}

/* Sections: null, .shstrtab, .strtab, .symtab (symbols: none, "other",
 * "kern"), .nv.info with attributes of both kernels and records of the
 * other formats in between; with shared, a kernel's static shared memory
 * too (.nv.shared.kern: no bits in the file, an offset and size beyond
 * it, as NVRTC writes it). */
static void build(image *im, uint32_t regs, uint32_t frame, int shared) {
    memset(im, 0, sizeof *im);
    im->n = 64;
    static const char shstr[] = "\0.shstrtab\0.strtab\0.symtab\0.nv.info\0.nv.shared.kern";
    static const char str[] = "\0other\0kern";
    const size_t shstr_at = append(im, shstr, sizeof shstr), str_at = append(im, str, sizeof str);
    uint8_t sym[3 * 24];
    memset(sym, 0, sizeof sym);
    put32(sym + 24, 1); /* "other" */
    put32(sym + 48, 7); /* "kern" */
    const size_t sym_at = append(im, sym, sizeof sym);
    uint8_t info[64];
    size_t k = 0;
    const uint32_t recs[4][3] = {{0x2f, 1, 40}, {0x11, 1, 16}, {0x2f, 2, regs}, {0x11, 2, frame}};
    for (int r = 0; r < 4; r++) {
        info[k] = 4;
        info[k + 1] = (uint8_t)recs[r][0];
        put16(info + k + 2, 8);
        put32(info + k + 4, recs[r][1]);
        put32(info + k + 8, recs[r][2]);
        k += 12;
        if (r == 1) { /* a 2-byte value and a bare record between */
            info[k] = 3;
            info[k + 1] = 0x1b;
            put16(info + k + 2, 0x100);
            info[k + 4] = 1;
            info[k + 5] = 0x30;
            k += 6;
        }
    }
    const size_t info_at = append(im, info, k);
    const size_t shoff = (im->n + 7) & ~(size_t)7;
    /* name, type, offset, size, link, entsize per section */
    const uint64_t sh[6][6] = {{0, 0, 0, 0, 0, 0},
                               {1, 3, shstr_at, sizeof shstr, 0, 0},
                               {11, 3, str_at, sizeof str, 0, 0},
                               {19, 2, sym_at, sizeof sym, 2, 24},
                               {27, 0x70000000, info_at, k, 3, 0},
                               {36, 8, 0x10000, 20480, 0, 0}};
    const int sections = shared ? 6 : 5;
    for (int i = 0; i < sections; i++) {
        uint8_t *h = im->b + shoff + (size_t)i * 64;
        put32(h, (uint32_t)sh[i][0]);
        put32(h + 4, (uint32_t)sh[i][1]);
        put64(h + 24, sh[i][2]);
        put64(h + 32, sh[i][3]);
        put32(h + 40, (uint32_t)sh[i][4]);
        put64(h + 56, sh[i][5]);
    }
    im->n = shoff + (size_t)sections * 64;
    memcpy(im->b, "\177ELF", 4);
    im->b[4] = 2;
    im->b[5] = 1;
    put64(im->b + 0x28, shoff);
    put16(im->b + 0x3a, 64);
    put16(im->b + 0x3c, (uint16_t)sections);
    put16(im->b + 0x3e, 1);
}
#endif

FA_TEST(reads_registers_and_frame) {
#ifndef FA_WITH_CUDA
    FA_SKIP("the CUDA backend is not built into this library");
#else
    image im;
    build(&im, 222, 0, 0);
    int regs = -1, frame = -1;
    CHECK(fa_cubin_kernel_resources(im.b, im.n, "kern", &regs, &frame) == 0);
    CHECK(regs == 222 && frame == 0);
    CHECK(fa_cubin_kernel_resources(im.b, im.n, "other", &regs, &frame) == 0);
    CHECK(regs == 40 && frame == 16);
    build(&im, 255, 8, 0);
    CHECK(fa_cubin_kernel_resources(im.b, im.n, "kern", &regs, &frame) == 0);
    CHECK(regs == 255 && frame == 8);
    /* A kernel with static shared memory (the HIP kernels through the
     * mapping): its section has no bits in the file. */
    build(&im, 186, 0, 1);
    CHECK(fa_cubin_kernel_resources(im.b, im.n, "kern", &regs, &frame) == 0);
    CHECK(regs == 186 && frame == 0);
    regs = frame = 7;
    CHECK(fa_cubin_kernel_resources(im.b, im.n, "missing", &regs, &frame) == -1);
    CHECK(regs == 7 && frame == 7);
    CHECK(fa_cubin_kernel_resources(NULL, im.n, "kern", &regs, &frame) == -1);
    CHECK(fa_cubin_kernel_resources(im.b, im.n, NULL, &regs, &frame) == -1);
    const char ptx[] = ".version 8.0\n.target sm_90\n";
    CHECK(fa_cubin_kernel_resources(ptx, sizeof ptx, "kern", &regs, &frame) == -1);
#endif
}

/* Every prefix of the image, and images with single bytes changed, parse
 * or fail without reading past their end. */
FA_TEST(truncated_or_corrupt_images_fail_cleanly) {
#ifndef FA_WITH_CUDA
    FA_SKIP("the CUDA backend is not built into this library");
#else
    image im;
    build(&im, 128, 0, 1);
    int regs, frame;
    for (size_t n = 0; n < im.n; n++) {
        uint8_t *copy = malloc(n ? n : 1);
        CHECK(copy != NULL);
        if (!copy) return;
        memcpy(copy, im.b, n);
        CHECK_MSG(fa_cubin_kernel_resources(copy, n, "kern", &regs, &frame) == -1, "prefix of %zu bytes", n);
        free(copy);
    }
    uint8_t *copy = malloc(im.n);
    CHECK(copy != NULL);
    if (!copy) return;
    for (size_t i = 0; i < im.n; i++)
        for (int v = 0; v < 3; v++) {
            memcpy(copy, im.b, im.n);
            copy[i] = (uint8_t)(v == 0 ? 0xff : v == 1 ? 0x00 : copy[i] ^ 0x80);
            (void)fa_cubin_kernel_resources(copy, im.n, "kern", &regs, &frame);
        }
    free(copy);
#endif
}

FA_TEST_MAIN(FA_CASE(reads_registers_and_frame), FA_CASE(truncated_or_corrupt_images_fail_cleanly))
