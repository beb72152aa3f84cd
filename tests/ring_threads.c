/* The in-process transport (ring_threads.h). Each rank has a queue of
 * incoming messages; a message is the sender's pointer, copied by the
 * receiver when it waits, and the sender's wait returns only once its own
 * message was taken, so the sender may then reuse its buffer, as with MPI.
 * Messages between two ranks are taken in the order they were sent, as
 * MPI orders messages of one tag and NCCL its operations. */
#include "ring_threads.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define QUEUE 8
#define MAX_AGREE 16

typedef struct message {
    const void *data;
    size_t bytes;
} message;

typedef struct inbox {
    message m[QUEUE];
    long head, tail; /* taken, sent */
} inbox;

struct ring_hub {
    int world;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    inbox *in;
    /* agree */
    int arrived;
    long generation;
    int64_t acc[MAX_AGREE], result[MAX_AGREE];
};

typedef struct endpoint {
    ring_hub *hub;
    int rank;
} endpoint;

typedef struct pending {
    void *recv;
    size_t recv_bytes;
    int to;
    long sent_index; /* index of our message in the inbox of `to` */
} pending;

ring_hub *ring_hub_create(int world) {
    ring_hub *h = calloc(1, sizeof *h);
    if (!h) return NULL;
    h->world = world;
    h->in = calloc((size_t)world, sizeof *h->in);
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    return h;
}

void ring_hub_destroy(ring_hub *h) {
    if (!h) return;
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->cv);
    free(h->in);
    free(h);
}

static fa_status hub_start(void *impl, void *queue, const void *send, size_t send_bytes, int to, void *recv,
                           size_t recv_bytes, int from, void **out) {
    endpoint *e = impl;
    ring_hub *h = e->hub;
    (void)queue;
    (void)from;
    pending *p = malloc(sizeof *p);
    if (!p) return FA_ERR_OUT_OF_MEMORY;
    pthread_mutex_lock(&h->mu);
    inbox *box = &h->in[to];
    while (box->tail - box->head >= QUEUE) pthread_cond_wait(&h->cv, &h->mu);
    box->m[box->tail % QUEUE] = (message){send, send_bytes};
    p->sent_index = box->tail++;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    p->recv = recv;
    p->recv_bytes = recv_bytes;
    p->to = to;
    *out = p;
    return FA_SUCCESS;
}

static fa_status hub_wait(void *impl, void *queue, void *token) {
    endpoint *e = impl;
    ring_hub *h = e->hub;
    pending *p = token;
    (void)queue;
    fa_status st = FA_SUCCESS;
    pthread_mutex_lock(&h->mu);
    inbox *mine = &h->in[e->rank];
    while (mine->tail == mine->head) pthread_cond_wait(&h->cv, &h->mu);
    const message m = mine->m[mine->head % QUEUE];
    if (m.bytes != p->recv_bytes)
        st = FA_ERR_INVALID_ARGUMENT;
    else
        memcpy(p->recv, m.data, m.bytes);
    mine->head++;
    pthread_cond_broadcast(&h->cv);
    /* Our own message must be taken before our buffer is reused. */
    while (h->in[p->to].head <= p->sent_index) pthread_cond_wait(&h->cv, &h->mu);
    pthread_mutex_unlock(&h->mu);
    free(p);
    return st;
}

static fa_status hub_agree(void *impl, int64_t *values, int count) {
    endpoint *e = impl;
    ring_hub *h = e->hub;
    if (count > MAX_AGREE) return FA_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&h->mu);
    const long gen = h->generation;
    for (int i = 0; i < count; i++)
        h->acc[i] = h->arrived == 0 || values[i] > h->acc[i] ? values[i] : h->acc[i];
    if (++h->arrived == h->world) {
        memcpy(h->result, h->acc, sizeof h->acc);
        h->arrived = 0;
        h->generation++;
        pthread_cond_broadcast(&h->cv);
    } else {
        while (h->generation == gen) pthread_cond_wait(&h->cv, &h->mu);
    }
    memcpy(values, h->result, sizeof(int64_t) * (size_t)count);
    pthread_mutex_unlock(&h->mu);
    return FA_SUCCESS;
}

static void hub_release(void *impl) { free(impl); }

fa_transport ring_hub_transport(ring_hub *hub, int rank) {
    endpoint *e = malloc(sizeof *e);
    if (e) {
        e->hub = hub;
        e->rank = rank;
    }
    fa_transport t = {rank, hub->world, 0, e, hub_start, hub_wait, hub_agree, hub_release};
    return t;
}

typedef struct thread_arg {
    void (*fn)(int, void *);
    int rank;
    void *arg;
} thread_arg;

static void *thread_main(void *p) {
    thread_arg *a = p;
    a->fn(a->rank, a->arg);
    return NULL;
}

void ring_threads_run(int world, void (*fn)(int rank, void *arg), void *const *args) {
    pthread_t *threads = calloc((size_t)world, sizeof *threads);
    thread_arg *targs = calloc((size_t)world, sizeof *targs);
    for (int r = 0; r < world; r++) {
        targs[r] = (thread_arg){fn, r, args[r]};
        pthread_create(&threads[r], NULL, thread_main, &targs[r]);
    }
    for (int r = 0; r < world; r++) pthread_join(threads[r], NULL);
    free(threads);
    free(targs);
}

/* NCCL's entry points the tests and the benchmark need to make
 * communicators (the library itself only uses the ones it is given). */
typedef int (*nccl_init_all_fn)(void **comms, int ndev, const int *devlist);
typedef int (*nccl_destroy_fn)(void *comm);
static void *nccl_lib;

static void *nccl_symbol(const char *name, char *why, size_t why_size) {
    if (!nccl_lib) {
        const char *path = getenv("FLASHATTN_NCCL_LIBRARY");
        nccl_lib = dlopen(path && *path ? path : "libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
        if (!nccl_lib) {
            snprintf(why, why_size, "%s", dlerror());
            return NULL;
        }
    }
    void *f = dlsym(nccl_lib, name);
    if (!f) snprintf(why, why_size, "%s not found in NCCL", name);
    return f;
}

fa_status ring_nccl_comms(int world, void **comms, char *why, size_t why_size) {
    void *sym = nccl_symbol("ncclCommInitAll", why, why_size);
    if (!sym) return FA_ERR_BACKEND_UNAVAILABLE;
    nccl_init_all_fn init; /* through memcpy: ISO C has no object-to-function pointer cast */
    memcpy(&init, &sym, sizeof init);
    int devices[64];
    if (world > 64) return FA_ERR_INVALID_ARGUMENT;
    for (int i = 0; i < world; i++) devices[i] = i;
    const int rc = init(comms, world, devices);
    if (rc != 0) {
        snprintf(why, why_size, "ncclCommInitAll over %d devices returned %d", world, rc);
        return FA_ERR_LAUNCH;
    }
    return FA_SUCCESS;
}

void ring_nccl_destroy(void *comm) {
    char why[64];
    void *sym = nccl_symbol("ncclCommDestroy", why, sizeof why);
    if (!sym || !comm) return;
    nccl_destroy_fn destroy;
    memcpy(&destroy, &sym, sizeof destroy);
    destroy(comm);
}
