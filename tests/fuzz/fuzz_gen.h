/* Attention descriptors and device descriptions decoded from fuzzer bytes.
 * Small shapes by default (each pass on the reference takes microseconds),
 * while every field can also take extreme values: offsets and strides near
 * 2^62, windows at INT_MIN and INT_MAX, cu_seqlens that jump or wrap,
 * block masks of the wrong size, NaN scales and dropout rates. */
#ifndef FA_FUZZ_GEN_H
#define FA_FUZZ_GEN_H

#include "flashattn.h"
#include "fuzz_input.h"

#include <stdio.h>

/* A descriptor with the host arrays it points to, each allocated to exactly
 * the size the header asks of a caller (batch + 1 offsets, block_mask_bytes
 * bytes), so any read past them is caught by AddressSanitizer. */
typedef struct fz_desc {
    fa_attention_desc d;
    int32_t *cu_q, *cu_k;
    uint8_t *mask;
    float *slopes; /* heads_q ALiBi slopes, or NULL */
} fz_desc;

void fz_desc_read(fz_in *in, fz_desc *out);
/* A deep copy; 0 when out of memory (out is then empty). */
int fz_desc_copy(fz_desc *out, const fz_desc *src);
void fz_desc_free(fz_desc *d);
/* Every field on a few lines (to read a crashing input). */
void fz_desc_print(FILE *f, const fz_desc *d);

/* One of the described devices, or an all-zero one, with a few fields
 * replaced. */
void fz_device_read(fz_in *in, fa_device_desc *out);
void fz_device_print(FILE *f, const fa_device_desc *d);

#endif
