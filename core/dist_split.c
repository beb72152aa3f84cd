/* The pieces of one ring step (dist_split.h).
 *
 * Positions: query i and key j of the whole sequence see each other when
 * j - i lies in a band [lo, hi] (the causal mask and the windows, aligned
 * bottom-right on the whole sequence), and the block mask allows it. A
 * rank holds one or two parts of the queries, and the visiting chunk one
 * or two parts of the keys; a pair of parts is a cell. In local
 * coordinates (rows and keys as the rank's buffers hold them) a cell's
 * band is the same band shifted by where the two parts lie. A rectangle
 * of cells is one piece when one band describes every cell of it (their
 * bands agree wherever the cells can reach), and an ordinary plan can
 * compute a band when it holds the piece's own bottom-right diagonal.
 * When it does not, the piece shrinks to the rows that see a key and the
 * keys that a row sees, whose bottom-right corner always lies in the band
 * (the last row sees the last key it can).
 *
 * Dropout draws each element's keep bit from its global row and column
 * (core/philox.h), four columns a call: a piece's plan takes the global
 * position of its first query and key as its dropout origin. That needs
 * contiguous global positions, so pieces are single cells, and a first key
 * at a multiple of 4, so a shrunk piece starts its keys at the multiple of
 * 4 below the first key a row sees; the keys added see no row, and the
 * bottom-right corner, which the band is expressed from, stays. */
#include "dist_split.h"

#include "desc.h"
#include "fa_internal.h"

#include <stdlib.h>
#include <string.h>

#define UNBOUNDED (INT64_C(1) << 62)
/* A refined block mask larger than this is refused rather than built. */
#define MAX_MASK_CELLS (INT64_C(1) << 26)

typedef struct band {
    int64_t lo, hi; /* +-UNBOUNDED: no bound on that side */
} band;

typedef struct rect {
    int p0, p1; /* query parts [p0, p1) */
    int q0, q1; /* key parts [q0, q1) */
} rect;

typedef struct step_parts {
    fa_dist_span qs[2], ks[2];
    int nq, nk;
} step_parts;

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

static int64_t gcd64(int64_t a, int64_t b) {
    a = a < 0 ? -a : a;
    b = b < 0 ? -b : b;
    while (b) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

static band whole_band(const fa_attention_desc *whole) {
    fa_attention_desc n = *whole;
    fa_desc_normalize_windows(&n);
    const int64_t s = (int64_t)whole->seqlen_k - whole->seqlen_q;
    band b = {-UNBOUNDED, UNBOUNDED};
    if (n.window_left >= 0) b.lo = s - n.window_left;
    if (n.window_right >= 0) b.hi = s + n.window_right;
    if (n.causal) b.hi = min64(b.hi, s);
    return b;
}

static band shift(band b, int64_t by) {
    band r = b;
    if (b.lo > -UNBOUNDED) r.lo += by;
    if (b.hi < UNBOUNDED) r.hi += by;
    return r;
}

/* j - i (local) of a cell's query part q and key part k: from where the
 * parts lie in the whole sequence and in the buffers. */
static int64_t cell_shift(const fa_dist_span *q, const fa_dist_span *k) {
    return (q->global - q->local) - (k->global - k->local);
}

/* A band as the cell can see it: clipped to the distances its rows and keys
 * reach; empty when lo > hi. */
static band clip(band b, const fa_dist_span *q, const fa_dist_span *k) {
    const int64_t dmin = k->local - (q->local + q->len - 1);
    const int64_t dmax = (k->local + k->len - 1) - q->local;
    band r = {max64(b.lo, dmin), min64(b.hi, dmax)};
    return r;
}

static int band_empty(band b) { return b.lo > b.hi; }

static int bands_agree(band a, band b) {
    if (band_empty(a) || band_empty(b)) return band_empty(a) && band_empty(b);
    return a.lo == b.lo && a.hi == b.hi;
}

/* The one local band that describes every cell of r, if there is one
 * (*none set when no cell sees anything). */
static int rect_band(const step_parts *sp, band global, rect r, band *out, int *none) {
    *none = 1;
    for (int p = r.p0; p < r.p1; p++)
        for (int q = r.q0; q < r.q1; q++)
            if (!band_empty(clip(shift(global, cell_shift(&sp->qs[p], &sp->ks[q])), &sp->qs[p], &sp->ks[q])))
                *none = 0;
    if (*none) return 1;
    for (int cp = r.p0; cp < r.p1; cp++)
        for (int cq = r.q0; cq < r.q1; cq++) {
            const band cand = shift(global, cell_shift(&sp->qs[cp], &sp->ks[cq]));
            int all = 1;
            for (int p = r.p0; p < r.p1 && all; p++)
                for (int q = r.q0; q < r.q1 && all; q++) {
                    const band want =
                        clip(shift(global, cell_shift(&sp->qs[p], &sp->ks[q])), &sp->qs[p], &sp->ks[q]);
                    all = bands_agree(want, clip(cand, &sp->qs[p], &sp->ks[q]));
                }
            if (all) {
                *out = cand;
                return 1;
            }
        }
    return 0;
}

/* Global position of local row `at` of the parts (every local row lies in
 * one part). */
static int64_t global_of(const fa_dist_span *parts, int n, int64_t at) {
    for (int i = 0; i < n; i++)
        if (at >= parts[i].local && at < parts[i].local + parts[i].len) return parts[i].global + (at - parts[i].local);
    return -1;
}

/* The largest block size that keeps every block of the piece's rows
 * [start, start + len) inside one block of the whole mask: it divides the
 * mask's block, the whole row of each part's piece row 0, and each part
 * border inside the piece. */
static int64_t refined_block(const fa_dist_span *parts, int n, int64_t start, int64_t len, int block) {
    int64_t g = block;
    for (int i = 0; i < n; i++) {
        const int64_t lo = max64(start, parts[i].local), hi = min64(start + len, parts[i].local + parts[i].len);
        if (lo >= hi) continue;
        g = gcd64(g, lo - start);
        /* piece row y of this part is whole row (global - local + start) + y */
        g = gcd64(g, parts[i].global - parts[i].local + start);
    }
    return g;
}

static fa_status piece_block_mask(const fa_attention_desc *whole, const step_parts *sp, fa_dist_piece *pc) {
    const int64_t gq = refined_block(sp->qs, sp->nq, pc->row0, pc->nrows, whole->block_q);
    const int64_t gk = refined_block(sp->ks, sp->nk, pc->key0, pc->nkeys, whole->block_k);
    const int64_t rows = (pc->nrows + gq - 1) / gq, cols = (pc->nkeys + gk - 1) / gk;
    if (rows > MAX_MASK_CELLS / cols)
        return fa_fail(FA_ERR_UNSUPPORTED,
                       "block mask across ranks: the parts of a rank do not align with the %dx%d blocks, and "
                       "a mask of %lldx%lld finer blocks is more than the ring builds; choose sequence lengths "
                       "whose chunks are multiples of the block sizes",
                       whole->block_q, whole->block_k, (long long)rows, (long long)cols);
    uint8_t *mask = malloc((size_t)(rows * cols));
    if (!mask) return fa_fail(FA_ERR_OUT_OF_MEMORY, "cannot allocate a block mask of %lld bytes", (long long)(rows * cols));
    const int64_t whole_cols = ((int64_t)whole->seqlen_k + whole->block_k - 1) / whole->block_k;
    for (int64_t r = 0; r < rows; r++) {
        const int64_t gi = global_of(sp->qs, sp->nq, pc->row0 + r * gq) / whole->block_q;
        for (int64_t c = 0; c < cols; c++) {
            const int64_t gj = global_of(sp->ks, sp->nk, pc->key0 + c * gk) / whole->block_k;
            mask[r * cols + c] = whole->block_mask[gi * whole_cols + gj];
        }
    }
    pc->block_mask = mask;
    pc->desc.block_mask = mask;
    pc->desc.block_mask_bytes = (size_t)(rows * cols);
    pc->desc.block_q = (int)gq;
    pc->desc.block_k = (int)gk;
    return FA_SUCCESS;
}

/* The piece of rectangle r under local band b: the rectangle itself when a
 * plan can compute b there, else its rows that see a key and keys that a
 * row sees. */
static fa_status make_piece(const fa_attention_desc *whole, const step_parts *sp, rect r, band b, fa_dist_piece *pc) {
    int64_t r0 = sp->qs[r.p0].local, r1 = sp->qs[r.p1 - 1].local + sp->qs[r.p1 - 1].len;
    int64_t k0 = sp->ks[r.q0].local, k1 = sp->ks[r.q1 - 1].local + sp->ks[r.q1 - 1].len;
    const int64_t corner = (k1 - 1) - (r1 - 1);
    if (b.lo > corner || b.hi < corner) {
        const int64_t a = max64(r0, k0 - b.hi), a1 = min64(r1, k1 - b.lo);
        const int64_t e = max64(k0, r0 + b.lo), e1 = min64(k1, r1 + b.hi);
        r0 = a;
        r1 = a1;
        k0 = e;
        k1 = e1;
    }
    const int dropout = whole->dropout_p > 0.0f;
    int64_t drop_row0 = 0, drop_col0 = 0;
    if (dropout) {
        const fa_dist_span *qs = &sp->qs[r.p0], *ks = &sp->ks[r.q0];
        if (r.p1 - r.p0 != 1 || r.q1 - r.q0 != 1 || ks->global % 4 != 0)
            return fa_fail(FA_ERR_INTERNAL, "ring piece: dropout needs single cells whose keys start at a multiple of 4");
        const int64_t first_key = ks->global + (k0 - ks->local);
        k0 -= first_key % 4; /* stays in the cell: its first key's position is a multiple of 4 */
        drop_row0 = qs->global + (r0 - qs->local);
        drop_col0 = first_key - first_key % 4;
    }
    memset(pc, 0, sizeof *pc);
    pc->drop_row0 = drop_row0;
    pc->drop_col0 = drop_col0;
    pc->row0 = r0;
    pc->nrows = r1 - r0;
    pc->key0 = k0;
    pc->nkeys = k1 - k0;
    pc->desc = *whole;
    pc->desc.seqlen_q = (int)pc->nrows;
    pc->desc.seqlen_k = (int)pc->nkeys;
    pc->desc.causal = 0;
    pc->desc.window_left = -1;
    pc->desc.window_right = -1;
    pc->desc.block_mask = NULL;
    pc->desc.block_mask_bytes = 0;
    /* The band seen from the piece's first row and key, against its own
     * bottom-right diagonal s. */
    const int64_t s = pc->nkeys - pc->nrows, by = r0 - k0;
    const band own = shift(b, by);
    if (own.lo > -UNBOUNDED && own.lo > -(pc->nrows - 1)) {
        if (own.lo > s) return fa_fail(FA_ERR_INTERNAL, "ring piece: the lower band edge passes the diagonal");
        pc->desc.window_left = (int)(s - own.lo);
    }
    if (own.hi < UNBOUNDED && own.hi < pc->nkeys - 1) {
        if (own.hi < s) return fa_fail(FA_ERR_INTERNAL, "ring piece: the upper band edge passes the diagonal");
        if (own.hi == s)
            pc->desc.causal = 1;
        else
            pc->desc.window_right = (int)(own.hi - s);
    }
    if (whole->block_mask) return piece_block_mask(whole, sp, pc);
    return FA_SUCCESS;
}

static int64_t overlap(int64_t a0, int64_t a1, int64_t b0, int64_t b1) {
    return max64(0, min64(a1, b1) - max64(a0, b0));
}

/* Variable-length batches: each cell is one piece, a sequence's queries of
 * the query part against its keys of the key part. The causal mask holds
 * per sequence where the parts are the same tokens; elsewhere a sequence's
 * keys lie wholly before its queries (all visible) or after (none). */
static fa_status varlen_piece(const fa_attention_desc *whole, const fa_dist_span *q, const fa_dist_span *k,
                              fa_dist_piece *pc, int *keep) {
    *keep = 0;
    int causal = 0;
    if (whole->causal) {
        if (q->global == k->global && q->len == k->len)
            causal = 1;
        else if (k->global >= q->global + q->len)
            return FA_SUCCESS;
        else if (k->global + k->len > q->global)
            return fa_fail(FA_ERR_INTERNAL, "ring piece: query and key parts overlap in part");
    }
    memset(pc, 0, sizeof *pc);
    const int nb = whole->batch;
    pc->cu_q = malloc(sizeof(int32_t) * (size_t)(nb + 1));
    pc->cu_k = malloc(sizeof(int32_t) * (size_t)(nb + 1));
    if (!pc->cu_q || !pc->cu_k) {
        free(pc->cu_q);
        free(pc->cu_k);
        memset(pc, 0, sizeof *pc);
        return fa_fail(FA_ERR_OUT_OF_MEMORY, "cannot allocate sequence offsets");
    }
    int64_t longest_q = 1, longest_k = 1, pairs = 0;
    pc->cu_q[0] = pc->cu_k[0] = 0;
    for (int b = 0; b < nb; b++) {
        const int64_t lq = overlap(whole->cu_seqlens_q[b], whole->cu_seqlens_q[b + 1], q->global, q->global + q->len);
        const int64_t lk = overlap(whole->cu_seqlens_k[b], whole->cu_seqlens_k[b + 1], k->global, k->global + k->len);
        pc->cu_q[b + 1] = (int32_t)(pc->cu_q[b] + lq);
        pc->cu_k[b + 1] = (int32_t)(pc->cu_k[b] + lk);
        longest_q = max64(longest_q, lq);
        longest_k = max64(longest_k, lk);
        pairs += lq && lk;
    }
    if (!pairs) {
        free(pc->cu_q);
        free(pc->cu_k);
        memset(pc, 0, sizeof *pc);
        return FA_SUCCESS;
    }
    pc->row0 = q->local;
    pc->nrows = q->len;
    pc->key0 = k->local;
    pc->nkeys = k->len;
    pc->desc = *whole;
    pc->desc.seqlen_q = (int)longest_q;
    pc->desc.seqlen_k = (int)longest_k;
    pc->desc.causal = causal;
    pc->desc.cu_seqlens_q = pc->cu_q;
    pc->desc.cu_seqlens_k = pc->cu_k;
    *keep = 1;
    return FA_SUCCESS;
}

void fa_dist_pieces_free(fa_dist_piece *pieces, int count) {
    if (!pieces) return;
    for (int i = 0; i < count; i++) {
        free(pieces[i].block_mask);
        free(pieces[i].cu_q);
        free(pieces[i].cu_k);
    }
    free(pieces);
}

static fa_status parts_of(const fa_attention_desc *whole, fa_cp_layout layout, int world, int rank, int source,
                          step_parts *sp) {
    const int varlen = whole->cu_seqlens_q != NULL;
    const int64_t nq = varlen ? whole->cu_seqlens_q[whole->batch] : whole->seqlen_q;
    const int64_t nk = varlen ? whole->cu_seqlens_k[whole->batch] : whole->seqlen_k;
    sp->nq = sp->nk = layout == FA_CP_ZIGZAG ? 2 : 1;
    for (int p = 0; p < sp->nq; p++) {
        FA_CHECK(fa_cp_part(layout, nq, world, rank, p, &sp->qs[p].global, &sp->qs[p].len, &sp->qs[p].local));
        FA_CHECK(fa_cp_part(layout, nk, world, source, p, &sp->ks[p].global, &sp->ks[p].len, &sp->ks[p].local));
    }
    return FA_SUCCESS;
}

fa_status fa_dist_split(const fa_attention_desc *whole, fa_cp_layout layout, int world, int rank, int source,
                        fa_dist_piece **pieces, int *count) {
    *pieces = NULL;
    *count = 0;
    step_parts sp;
    FA_CHECK(parts_of(whole, layout, world, rank, source, &sp));
    fa_dist_piece *out = calloc(4, sizeof *out);
    if (!out) return fa_fail(FA_ERR_OUT_OF_MEMORY, "cannot allocate the pieces of a ring step");
    int n = 0;
    fa_status st = FA_SUCCESS;
    if (whole->cu_seqlens_q) {
        for (int p = 0; p < sp.nq && st == FA_SUCCESS; p++)
            for (int q = 0; q < sp.nk && st == FA_SUCCESS; q++) {
                int keep;
                st = varlen_piece(whole, &sp.qs[p], &sp.ks[q], &out[n], &keep);
                n += st == FA_SUCCESS && keep;
            }
    } else {
        /* Fewest rectangles first: the whole step, then its key parts or its
         * query parts apart, then every cell alone (always one band). With
         * dropout only cells: a piece's mask origin is one global position. */
        const band global = whole_band(whole);
        rect options[4][4];
        int sizes[4] = {0, 0, 0, 0};
        options[0][sizes[0]++] = (rect){0, sp.nq, 0, sp.nk};
        for (int q = 0; q < sp.nk && sp.nk > 1; q++) options[1][sizes[1]++] = (rect){0, sp.nq, q, q + 1};
        for (int p = 0; p < sp.nq && sp.nq > 1; p++) options[2][sizes[2]++] = (rect){p, p + 1, 0, sp.nk};
        for (int p = 0; p < sp.nq; p++)
            for (int q = 0; q < sp.nk; q++) options[3][sizes[3]++] = (rect){p, p + 1, q, q + 1};
        for (int o = whole->dropout_p > 0.0f ? 3 : 0; o < 4; o++) {
            if (!sizes[o]) continue;
            band bands[4];
            int none[4], ok = 1;
            for (int i = 0; i < sizes[o] && ok; i++) ok = rect_band(&sp, global, options[o][i], &bands[i], &none[i]);
            if (!ok) continue;
            for (int i = 0; i < sizes[o] && st == FA_SUCCESS; i++) {
                if (none[i]) continue;
                st = make_piece(whole, &sp, options[o][i], bands[i], &out[n]);
                n++;
            }
            break;
        }
    }
    if (st != FA_SUCCESS || n == 0) {
        fa_dist_pieces_free(out, 4); /* unused entries are zero */
        return st;
    }
    *pieces = out;
    *count = n;
    return FA_SUCCESS;
}
