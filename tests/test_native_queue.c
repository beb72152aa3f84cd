/* fa_context_set_native_queue on the device backends: the caller's queue
 * carries the passes, copies and timing events; switching queues orders the
 * new one after the context's earlier work; queues that cannot serve the
 * context are refused; the library holds a reference to an OpenCL queue
 * only while it uses it. (The reference backend's refusal is in
 * test_api.c.)
 *
 * fa-test-labels: device
 *
 * OpenCL proves where the work went with a gate: a user event the caller's
 * queue waits on, opened by a second thread only after the test has queued
 * its pass; a pass that was not behind the gate completes while it is still
 * shut. CUDA and HIP run on a stream the test creates through the runtime
 * the backend loaded. Every case skips where its backend is missing. */
#include "call_runner.h"
#include "harness.h"
#include "test_util.h"

#include "dynlib.h"
#include "flashattn.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#ifdef FA_WITH_OPENCL
#include "backends/opencl/cl_runtime_internal.h"
#endif

static char skip_reason[600];

/* A context on the backend's best device, or NULL with skip_reason set. */
static fa_context open_context(fa_backend backend) {
    char reason[512] = "";
    if (fa_backend_get_status(backend, reason, sizeof reason) != FA_SUCCESS) {
        snprintf(skip_reason, sizeof skip_reason, "%s unavailable: %s", fa_backend_name(backend), reason);
        return NULL;
    }
    fa_context ctx = NULL;
    CHECK_OK(fa_context_create(backend, -1, &ctx));
    if (!ctx) snprintf(skip_reason, sizeof skip_reason, "no %s context", fa_backend_name(backend));
    return ctx;
}

static void *queue_in_use(fa_context ctx) {
    void *queue = NULL;
    CHECK_OK(fa_context_get_native(ctx, NULL, &queue));
    return queue;
}

/* A small problem with every mask the kernels take at once. */
static fa_attention_desc problem_desc(void) {
    fa_attention_desc d;
    fa_attention_desc_init(&d);
    d.batch = 2;
    d.seqlen_q = 37;
    d.seqlen_k = 45;
    d.heads_q = 4;
    d.heads_kv = 2;
    d.head_dim = 32;
    d.causal = 1;
    return d;
}

/* Plan, problem and buffers of problem_desc on ctx; 0 after a failed CHECK. */
typedef struct setup {
    call_problem problem;
    fa_plan plan;
    call_buffers buffers;
} setup;

static int setup_init(setup *s, fa_context ctx, uint64_t seed) {
    memset(s, 0, sizeof *s);
    fa_attention_desc d = problem_desc();
    call_problem_init(&s->problem, &d, seed);
    CHECK_OK(fa_plan_create(ctx, &d, &s->plan));
    return s->plan && call_buffers_init(&s->buffers, ctx, &s->problem);
}

static void setup_free(setup *s) {
    call_buffers_free(&s->buffers);
    if (s->plan) fa_plan_destroy(s->plan);
    call_problem_free(&s->problem);
    memset(s, 0, sizeof *s);
}

/* Downloads what the passes wrote and checks it against the reference. */
static void check_results(setup *s, const char *what) {
    call_host out;
    if (call_download(&s->buffers, &s->problem, &out)) call_check_reference(&s->problem, &out, what);
    call_host_free(&out);
}

/* ------------------------------------------------------------------------ */
/* OpenCL                                                                   */

#ifdef FA_WITH_OPENCL

/* What the backend's table lacks: user events, which only the gate needs. */
typedef struct cl_user_events {
    cl_event(CL_API_CALL *create)(cl_context, cl_int *);
    cl_int(CL_API_CALL *set_status)(cl_event, cl_int);
} cl_user_events;

static int load_user_events(cl_user_events *ev) {
    static const char *const names[] = {"libOpenCL.so.1", "libOpenCL.so", NULL};
    char why[512];
    void *lib = fa_dynlib_open(names, why, sizeof why);
    void *create = lib ? fa_dynlib_symbol(lib, "clCreateUserEvent", why, sizeof why) : NULL;
    void *set = lib ? fa_dynlib_symbol(lib, "clSetUserEventStatus", why, sizeof why) : NULL;
    CHECK_MSG(create && set, "the OpenCL loader offers no user events: %s", why);
    memcpy(&ev->create, &create, sizeof create);
    memcpy(&ev->set_status, &set, sizeof set);
    return create && set;
}

/* A user event a queue waits on, opened by a thread of its own once the
 * test says its work is queued (or after 20 s, so that a pass that waited
 * on the gate itself fails a check instead of hanging). */
typedef struct gate {
    cl_user_events api;
    cl_event event;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int queued;
    atomic_int opened;
} gate;

static void *gate_opener(void *arg) {
    gate *g = arg;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 20;
    pthread_mutex_lock(&g->lock);
    while (!g->queued)
        if (pthread_cond_timedwait(&g->cond, &g->lock, &until) != 0) break;
    pthread_mutex_unlock(&g->lock);
    /* Time for work that did not wait on the gate to finish first. */
    nanosleep(&(struct timespec){0, 200 * 1000 * 1000}, NULL);
    atomic_store(&g->opened, 1);
    g->api.set_status(g->event, CL_COMPLETE);
    return NULL;
}

/* Shuts queue behind a new gate and starts its opener; 0 on failure. */
static int gate_shut(gate *g, cl_context context, cl_command_queue queue) {
    memset(g, 0, sizeof *g);
    if (!load_user_events(&g->api)) return 0;
    cl_int err = CL_SUCCESS;
    g->event = g->api.create(context, &err);
    CHECK_MSG(err == CL_SUCCESS && g->event, "clCreateUserEvent: %d", (int)err);
    if (!g->event) return 0;
    err = fa_cl.clEnqueueBarrierWithWaitList(queue, 1, &g->event, NULL);
    CHECK_MSG(err == CL_SUCCESS, "clEnqueueBarrierWithWaitList: %d", (int)err);
    pthread_mutex_init(&g->lock, NULL);
    pthread_cond_init(&g->cond, NULL);
    atomic_init(&g->opened, 0);
    if (err == CL_SUCCESS && pthread_create(&g->thread, NULL, gate_opener, g) == 0) return 1;
    g->api.set_status(g->event, CL_COMPLETE);
    fa_cl.clReleaseEvent(g->event);
    return 0;
}

static void gate_queued(gate *g) {
    pthread_mutex_lock(&g->lock);
    g->queued = 1;
    pthread_cond_signal(&g->cond);
    pthread_mutex_unlock(&g->lock);
}

static void gate_finish(gate *g) {
    gate_queued(g);
    pthread_join(g->thread, NULL);
    fa_cl.clReleaseEvent(g->event);
    pthread_mutex_destroy(&g->lock);
    pthread_cond_destroy(&g->cond);
}

typedef struct cl_native {
    cl_context context;
    cl_command_queue own;
    cl_device_id device;
} cl_native;

static int cl_native_of(fa_context ctx, cl_native *n) {
    void *c = NULL, *q = NULL;
    CHECK_OK(fa_context_get_native(ctx, &c, &q));
    n->context = c;
    n->own = q;
    n->device = NULL;
    cl_int err = q ? fa_cl.clGetCommandQueueInfo(n->own, CL_QUEUE_DEVICE, sizeof n->device, &n->device, NULL)
                   : CL_INVALID_COMMAND_QUEUE;
    CHECK_MSG(err == CL_SUCCESS, "clGetCommandQueueInfo(CL_QUEUE_DEVICE): %d", (int)err);
    return err == CL_SUCCESS;
}

/* A case's OpenCL context and its native objects; NULL when there is none
 * (skip_reason set) or a query failed (a CHECK with it). */
static fa_context opencl_case(cl_native *n, setup *s) {
    memset(s, 0, sizeof *s);
    fa_context ctx = open_context(FA_BACKEND_OPENCL);
    if (ctx && !cl_native_of(ctx, n)) {
        fa_context_destroy(ctx);
        return NULL;
    }
    return ctx;
}

static cl_command_queue new_queue(const cl_native *n, cl_context context, cl_command_queue_properties props) {
    cl_int err = CL_SUCCESS;
    cl_command_queue q = fa_cl.clCreateCommandQueue(context, n->device, props, &err);
    CHECK_MSG(err == CL_SUCCESS && q, "clCreateCommandQueue(properties %#llx): %d", (unsigned long long)props,
              (int)err);
    return err == CL_SUCCESS ? q : NULL;
}

/* Whether q's reference count settles at want within two seconds. Commands
 * and events of a queue hold references of their own until the runtime
 * retires them, after they complete: the count is read when q is idle, and
 * again until it settles. */
static int queue_refs_settle(cl_command_queue q, cl_uint want) {
    cl_uint refs = 0;
    CHECK(fa_cl.clFinish(q) == CL_SUCCESS);
    for (int tries = 0; tries < 2000; tries++) {
        if (fa_cl.clGetCommandQueueInfo(q, CL_QUEUE_REFERENCE_COUNT, sizeof refs, &refs, NULL) != CL_SUCCESS) break;
        if (refs == want) return 1;
        nanosleep(&(struct timespec){0, 1000 * 1000}, NULL);
    }
    printf("  the queue holds %u references, not %u\n", (unsigned)refs, (unsigned)want);
    return 0;
}

FA_TEST(opencl_caller_queue_carries_the_work) {
    cl_native n;
    setup s;
    fa_context ctx = opencl_case(&n, &s);
    if (!ctx) FA_SKIP(skip_reason);
    if (setup_init(&s, ctx, 101)) {
        cl_command_queue mine = new_queue(&n, n.context, CL_QUEUE_PROFILING_ENABLE);
        if (mine) {
            CHECK(queue_refs_settle(mine, 1));
            CHECK_OK(fa_context_set_native_queue(ctx, mine));
            CHECK(queue_in_use(ctx) == (void *)mine);
            CHECK_MSG(queue_refs_settle(mine, 2), "the context holds a reference while it uses the queue");
            CHECK_OK(fa_context_set_native_queue(ctx, mine)); /* again: nothing changes */
            CHECK(queue_refs_settle(mine, 2));

            gate g;
            if (gate_shut(&g, n.context, mine)) {
                CHECK_OK(call_forward(s.plan, &s.buffers));
                CHECK_MSG(!atomic_load(&g.opened), "fa_forward waited for the caller's queue");
                gate_queued(&g);
                /* The pass's own events: complete only once the gate is open. */
                double ms = -1.0;
                CHECK_OK(fa_plan_last_time_ms(s.plan, &ms));
                CHECK_MSG(atomic_load(&g.opened), "the forward pass ran before the caller's queue reached it");
                CHECK(ms >= 0.0);
                gate_finish(&g);
            }
            CHECK_OK(call_backward(s.plan, &s.buffers));
            CHECK_OK(fa_context_synchronize(ctx));
            check_results(&s, "OpenCL, on the caller's queue");

            CHECK_OK(fa_context_set_native_queue(ctx, NULL));
            CHECK(queue_in_use(ctx) == (void *)n.own);
            /* The plan's events of the last pass hold references too. */
            setup_free(&s);
            CHECK_MSG(queue_refs_settle(mine, 1), "the context kept the queue after it stopped using it");
            fa_cl.clReleaseCommandQueue(mine);
        }
    }
    setup_free(&s);
    fa_context_destroy(ctx);
}

FA_TEST(opencl_switch_waits_for_the_previous_queue) {
    cl_native n;
    setup s;
    fa_context ctx = opencl_case(&n, &s);
    if (!ctx) FA_SKIP(skip_reason);
    gate g;
    if (setup_init(&s, ctx, 202) && gate_shut(&g, n.context, n.own)) {
        /* The forward pass waits behind the gate on the context's queue. */
        CHECK_OK(call_forward(s.plan, &s.buffers));
        cl_command_queue mine = new_queue(&n, n.context, 0);
        if (mine) {
            CHECK_OK(fa_context_set_native_queue(ctx, mine));
            CHECK_MSG(!atomic_load(&g.opened), "switching queues waited on the host");
            cl_event marker = NULL;
            CHECK(fa_cl.clEnqueueMarkerWithWaitList(mine, 0, NULL, &marker) == CL_SUCCESS);
            CHECK(fa_cl.clFlush(mine) == CL_SUCCESS);
            gate_queued(&g);
            if (marker) {
                CHECK(fa_cl.clWaitForEvents(1, &marker) == CL_SUCCESS);
                CHECK_MSG(atomic_load(&g.opened), "the new queue ran ahead of the context's work on the old one");
                fa_cl.clReleaseEvent(marker);
            }
            CHECK_OK(call_backward(s.plan, &s.buffers));
            check_results(&s, "OpenCL, forward on the context's queue, backward on the caller's");
            CHECK_OK(fa_context_set_native_queue(ctx, NULL));
            fa_cl.clReleaseCommandQueue(mine);
        }
        gate_finish(&g);
    }
    setup_free(&s);
    fa_context_destroy(ctx);
}

FA_TEST(opencl_queue_checks) {
    cl_native n;
    setup s;
    fa_context ctx = opencl_case(&n, &s);
    if (!ctx) FA_SKIP(skip_reason);
    /* A queue of another cl_context on the same device. */
    cl_int err = CL_SUCCESS;
    cl_context other = fa_cl.clCreateContext(NULL, 1, &n.device, NULL, NULL, &err);
    CHECK_MSG(err == CL_SUCCESS && other, "clCreateContext: %d", (int)err);
    cl_command_queue foreign = other ? new_queue(&n, other, 0) : NULL;
    if (foreign) {
        CHECK_FAILS(fa_context_set_native_queue(ctx, foreign), FA_ERR_INVALID_ARGUMENT, "another cl_context");
        CHECK(queue_in_use(ctx) == (void *)n.own);
        CHECK(queue_refs_settle(foreign, 1));
        fa_cl.clReleaseCommandQueue(foreign);
    }
    if (other) fa_cl.clReleaseContext(other);

    /* Out of order: refused where the device makes one. */
    cl_command_queue ooo =
        fa_cl.clCreateCommandQueue(n.context, n.device, CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE, &err);
    if (ooo) {
        CHECK_FAILS(fa_context_set_native_queue(ctx, ooo), FA_ERR_UNSUPPORTED, "out of order");
        CHECK(queue_refs_settle(ooo, 1));
        fa_cl.clReleaseCommandQueue(ooo);
    } else {
        printf("  this device makes no out-of-order queue (%d): that refusal is not exercised\n", (int)err);
    }

    /* Without profiling the passes run, but cannot be timed. */
    cl_command_queue plain = new_queue(&n, n.context, 0);
    if (plain && setup_init(&s, ctx, 303)) {
        CHECK_OK(fa_context_set_native_queue(ctx, plain));
        CHECK_OK(call_forward(s.plan, &s.buffers));
        CHECK_OK(call_backward(s.plan, &s.buffers));
        double ms = -1.0;
        CHECK_STATUS(fa_plan_last_time_ms(s.plan, &ms), FA_ERR_UNSUPPORTED);
        check_results(&s, "OpenCL, on a queue without profiling");
    }
    setup_free(&s);
    /* The context's last reference lets the queue go with it. */
    fa_context_destroy(ctx);
    if (plain) {
        CHECK_MSG(queue_refs_settle(plain, 1), "the context kept the caller's queue after it was destroyed");
        fa_cl.clReleaseCommandQueue(plain);
    }
}

#else

#define NOT_BUILT(name)                                                                                                \
    FA_TEST(name) { FA_SKIP("the OpenCL backend is not compiled into this build"); }
NOT_BUILT(opencl_caller_queue_carries_the_work)
NOT_BUILT(opencl_switch_waits_for_the_previous_queue)
NOT_BUILT(opencl_queue_checks)

#endif

/* ------------------------------------------------------------------------ */
/* CUDA and HIP: a stream made through the runtime the backend loaded        */

/* The runtime's stream calls, from the library the backend opens (same
 * override variable, same default names: a process loads it once). Their
 * result types are the runtimes' error enums, ints in the C ABI. */
typedef struct gpu_runtime {
    fa_backend backend;
    const char *library_env;
    const char *libraries[4];
    const char *enter_name, *leave_name, *create_name, *destroy_name;
} gpu_runtime;

static const gpu_runtime cuda_runtime = {FA_BACKEND_CUDA,
                                         "FLASHATTN_CUDA_LIBRARY",
                                         {"libcuda.so.1", "libcuda.so", NULL},
                                         "cuCtxPushCurrent_v2",
                                         "cuCtxPopCurrent_v2",
                                         "cuStreamCreate",
                                         "cuStreamDestroy_v2"};
static const gpu_runtime hip_runtime = {FA_BACKEND_HIP,
                                        "FLASHATTN_HIP_LIBRARY",
                                        {"libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5", NULL},
                                        "hipSetDevice",
                                        NULL,
                                        "hipStreamCreateWithFlags",
                                        "hipStreamDestroy"};

typedef struct gpu_calls {
    const gpu_runtime *rt;
    void *native_context;       /* CUcontext, or the HIP device ordinal */
    int (*push)(void *);        /* cuCtxPushCurrent */
    int (*pop)(void **);        /* cuCtxPopCurrent */
    int (*set_device)(int);     /* hipSetDevice */
    int (*create)(void **, unsigned);
    int (*destroy)(void *);
} gpu_calls;

static void *symbol(void *lib, const char *name) {
    char why[512] = "";
    void *sym = name ? fa_dynlib_symbol(lib, name, why, sizeof why) : NULL;
    CHECK_MSG(!name || sym, "%s", why);
    return sym;
}

static int load_gpu_calls(const gpu_runtime *rt, fa_context ctx, gpu_calls *g) {
    memset(g, 0, sizeof *g);
    g->rt = rt;
    CHECK_OK(fa_context_get_native(ctx, &g->native_context, NULL));
    const char *env = getenv(rt->library_env);
    const char *named[2] = {env, NULL};
    char why[1024] = "";
    void *lib = fa_dynlib_open(env && env[0] ? named : rt->libraries, why, sizeof why);
    CHECK_MSG(lib != NULL, "the backend's runtime library: %s", why);
    if (!lib) return 0;
    void *enter = symbol(lib, rt->enter_name), *leave = symbol(lib, rt->leave_name);
    void *create = symbol(lib, rt->create_name), *destroy = symbol(lib, rt->destroy_name);
    if (rt->backend == FA_BACKEND_CUDA) {
        memcpy(&g->push, &enter, sizeof enter);
        memcpy(&g->pop, &leave, sizeof leave);
    } else {
        memcpy(&g->set_device, &enter, sizeof enter);
    }
    memcpy(&g->create, &create, sizeof create);
    memcpy(&g->destroy, &destroy, sizeof destroy);
    return enter && create && destroy && (leave || !rt->leave_name);
}

/* Runs call with the context's device current, as the runtime needs. */
static int with_device(const gpu_calls *g, int (*call)(const gpu_calls *, void **), void **stream) {
    int r = g->push ? g->push(g->native_context) : g->set_device((int)(intptr_t)g->native_context);
    if (r != 0) return r;
    r = call(g, stream);
    if (g->pop) {
        void *previous = NULL;
        g->pop(&previous);
    }
    return r;
}

static int create_call(const gpu_calls *g, void **stream) { return g->create(stream, 1u /* non-blocking */); }
static int destroy_call(const gpu_calls *g, void **stream) { return g->destroy(*stream); }

static void caller_stream_case(const gpu_runtime *rt) {
    fa_context ctx = open_context(rt->backend);
    if (!ctx) FA_SKIP(skip_reason);
    const char *name = fa_backend_name(rt->backend);
    gpu_calls g;
    setup s;
    memset(&s, 0, sizeof s);
    void *own = queue_in_use(ctx), *stream = NULL;
    if (load_gpu_calls(rt, ctx, &g) && setup_init(&s, ctx, 404)) {
        int r = with_device(&g, create_call, &stream);
        CHECK_MSG(r == 0 && stream, "%s: %s = %d", name, rt->create_name, r);
        if (stream) {
            CHECK_OK(fa_context_set_native_queue(ctx, stream));
            CHECK(queue_in_use(ctx) == stream);
            CHECK_OK(call_forward(s.plan, &s.buffers));
            CHECK_OK(call_backward(s.plan, &s.buffers));
            double ms = -1.0;
            CHECK_OK(fa_plan_last_time_ms(s.plan, &ms));
            CHECK(ms >= 0.0);
            CHECK_OK(fa_context_synchronize(ctx));
            check_results(&s, rt->create_name);
            CHECK_OK(fa_context_set_native_queue(ctx, NULL));
            CHECK(queue_in_use(ctx) == own);
            r = with_device(&g, destroy_call, &stream);
            CHECK_MSG(r == 0, "%s: %s = %d", name, rt->destroy_name, r);
        }
    }
    if (rt->backend == FA_BACKEND_CUDA && s.plan) {
        /* The legacy default stream has a handle of its own (CU_STREAM_LEGACY). */
        void *legacy = (void *)(uintptr_t)0x1;
        call_buffers_free(&s.buffers);
        if (call_buffers_init(&s.buffers, ctx, &s.problem)) {
            CHECK_OK(fa_context_set_native_queue(ctx, legacy));
            CHECK(queue_in_use(ctx) == legacy);
            CHECK_OK(call_forward(s.plan, &s.buffers));
            CHECK_OK(call_backward(s.plan, &s.buffers));
            check_results(&s, "CU_STREAM_LEGACY");
            CHECK_OK(fa_context_set_native_queue(ctx, NULL));
        }
    }
    setup_free(&s);
    fa_context_destroy(ctx);
}

FA_TEST(cuda_caller_stream) { caller_stream_case(&cuda_runtime); }
FA_TEST(hip_caller_stream) { caller_stream_case(&hip_runtime); }

FA_TEST_MAIN(FA_CASE(opencl_caller_queue_carries_the_work), FA_CASE(opencl_switch_waits_for_the_previous_queue),
             FA_CASE(opencl_queue_checks), FA_CASE(cuda_caller_stream), FA_CASE(hip_caller_stream))
