// Does compute-sanitizer's racecheck take an mbarrier's phase as ordering
// shared-memory accesses? One warp writes shared memory and arrives on an
// mbarrier; another waits for the phase (mbarrier.try_wait.parity, as
// kernels_cuda/tma.cuh waits) and reads. Correct code: a report on
// "ordered" is the tool's, not the code's. "warp" has the writers meet
// (__syncwarp) and lane 0 alone arrive for them, as the backward's
// consumers release a stage: also correct by PTX's memory model (the warp
// barrier orders each lane's write before lane 0's release), so a report
// there says the tool does not carry ordering through a warp barrier.
// "racy" reads without waiting, to show the tool finds a race where there
// is one. "named" orders by a named barrier of two warps while a third
// (a producer's) stays out of it, as the backward's consumers meet before
// their epilogue (bar.sync 1, 64): a report there is the tool's. "arrive"
// has the writers only arrive (bar.arrive) where the readers wait
// (bar.sync), as a warpgroup hands its dS^T to the one whose dQ turn it
// is: correct too. Build and run:
//   nvcc -arch=sm_90 -o /tmp/probe bench/probes/mbarrier_racecheck.cu
//   compute-sanitizer --tool racecheck /tmp/probe ordered   (warp, named, arrive, alternate, alternate-odd, racy)
#include <cstdio>
#include <cstring>

__device__ __forceinline__ unsigned smem_addr(const void *p) {
    return (unsigned)__cvta_generic_to_shared(p);
}

__global__ void probe_named(int *out, int writers_arrive) {
    __shared__ int data[32];
    if (threadIdx.x < 32) return; /* the warp that stays out */
    if (threadIdx.x < 64) {
        data[threadIdx.x - 32] = (int)threadIdx.x - 31;
        if (writers_arrive)
            asm volatile("bar.arrive 1, 64;" ::: "memory");
        else
            asm volatile("bar.sync 1, 64;" ::: "memory");
        return;
    }
    asm volatile("bar.sync 1, 64;" ::: "memory");
    out[threadIdx.x - 64] = data[95 - threadIdx.x];
}

/* "alternate": the backward's dQ turns, then its epilogue. A producer
 * warpgroup leaves at once; of two consumer warpgroups, in each of four
 * steps the one in turn waits at named barrier 2 + step % 2 (bar.sync,
 * 256) where the other only arrives (bar.arrive); then every consumer
 * thread writes its word, both meet at barrier 1 (bar.sync 1, 256) and
 * each reads a word the other warpgroup wrote. Correct: a report is the
 * tool's. "alternate-odd" takes three steps, so that one warpgroup's last
 * barrier before the epilogue is an arrival, as in a backward block whose
 * walk has an odd number of query tiles (the causal mask's last key
 * tiles): correct too. */
__global__ void probe_alternate(int *out, int steps) {
    __shared__ int data[256];
    if (threadIdx.x < 128) return;
    const int c = (int)threadIdx.x - 128, wg = c / 128;
    for (int step = 0; step < steps; step++) {
        if (wg == step % 2)
            asm volatile("bar.sync %0, 256;" ::"r"(2 + step % 2) : "memory");
        else
            asm volatile("bar.arrive %0, 256;" ::"r"(2 + step % 2) : "memory");
    }
    data[c] = c + 1;
    asm volatile("bar.sync %0, %1;" ::"r"(1), "r"(256) : "memory");
    const int v = data[255 - c];
    asm volatile("bar.sync %0, %1;" ::"r"(1), "r"(256) : "memory");
    data[c] = v; /* written again after both read: the epilogue's second meeting */
    asm volatile("bar.sync %0, %1;" ::"r"(1), "r"(256) : "memory");
    if (c < 32) out[c] = data[c];
}

__global__ void probe(int *out, int wait, int by_lane0) {
    __shared__ alignas(8) unsigned long long bar;
    __shared__ int data[32];
    const unsigned b = smem_addr(&bar);
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(b), "r"(by_lane0 ? 1 : 32) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x < 32) {
        data[threadIdx.x] = (int)threadIdx.x + 1;
        if (by_lane0) __syncwarp();
        if (!by_lane0 || threadIdx.x == 0)
            asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(b) : "memory");
    } else if (threadIdx.x < 64) {
        if (wait)
            asm volatile("{\n.reg .pred done;\nW:\n"
                         "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                         "@!done bra W;\n}\n" ::"r"(b),
                         "r"(0)
                         : "memory");
        out[threadIdx.x - 32] = data[threadIdx.x - 32];
    }
}

int main(int argc, char **argv) {
    const int wait = !(argc > 1 && strcmp(argv[1], "racy") == 0);
    const int by_lane0 = argc > 1 && strcmp(argv[1], "warp") == 0;
    int *out = nullptr, host[32];
    cudaMalloc(&out, sizeof host);
    const int arrive = argc > 1 && strcmp(argv[1], "arrive") == 0;
    const int named = arrive || (argc > 1 && strcmp(argv[1], "named") == 0);
    const int odd = argc > 1 && strcmp(argv[1], "alternate-odd") == 0;
    const int one = argc > 1 && strcmp(argv[1], "alternate-1") == 0;
    const int alternate = odd || one || (argc > 1 && strcmp(argv[1], "alternate") == 0);
    if (alternate)
        probe_alternate<<<1, 384>>>(out, one ? 1 : odd ? 3 : 4);
    else if (named)
        probe_named<<<1, 96>>>(out, arrive);
    else
        probe<<<1, 64>>>(out, wait, by_lane0);
    cudaMemcpy(host, out, sizeof host, cudaMemcpyDeviceToHost);
    int ok = 1;
    for (int i = 0; i < 32; i++) ok &= host[i] == (alternate ? 256 - i : named ? 32 - i : i + 1) || !wait;
    printf("%s: %s\n", argc > 1 ? argv[1] : "ordered", ok ? "values as written" : "wrong values");
    cudaFree(out);
    return ok ? 0 : 1;
}
