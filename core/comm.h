/* A communicator: the transport the caller gave, checked and copied. */
#ifndef FA_COMM_H
#define FA_COMM_H

#include "flashattn.h"

struct fa_comm_s {
    fa_transport t;
    /* The context an NCCL/RCCL transport lives on (kept alive with the
     * communicator); NULL for a caller's transport. */
    fa_context ctx;
};

/* Every rank's values[i] becomes its maximum over the ranks (the
 * transport's agree), with the transport's failure reported as such. */
fa_status fa_comm_agree(fa_comm comm, int64_t *values, int count);

#endif
