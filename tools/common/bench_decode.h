/* fa-bench --decode (bench_decode.c): decoding steps against a contiguous
 * KV cache, timed beside a device copy of the same bytes. */
#ifndef FA_BENCH_DECODE_H
#define FA_BENCH_DECODE_H

/* The whole tool for argv holding --decode; returns its exit status. */
int fa_bench_decode(int argc, char **argv);

#endif
