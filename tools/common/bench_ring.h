/* fa-bench --ranks (bench_ring.c): ring attention over several ranks of this
 * process, timed beside one device running a rank's share alone. */
#ifndef FA_BENCH_RING_H
#define FA_BENCH_RING_H

/* The whole tool for argv holding --ranks; returns its exit status. */
int fa_bench_ring(int argc, char **argv);

#endif
