/* Can an OpenCL C kernel reach Hopper's warpgroup matrix instructions
 * through NVIDIA's OpenCL? One work-group of 128 work-items (a warpgroup)
 * puts A (64 x 16) and B (8 x 16, K-major) into local memory in the
 * canonical no-swizzle layout (8 x 8 core matrices of 128 contiguous
 * bytes), builds the two matrix descriptors and runs one
 * wgmma.mma_async m64n8k16 f32 += f16 * f16 (inline PTX), then compares
 * D = A B^T with the host's product. The descriptors' two byte offsets
 * (between core matrices along K, and along M or N) are tried both ways
 * round, since which field is which is what a first kernel gets wrong.
 * Prints the build log's first lines where the program does not build.
 *
 * NVIDIA's OpenCL writes its PTX for ".target sm_90" whatever
 * -cl-nv-arch says, and ptxas refuses wgmma there (sm_90a only). So the
 * kernel's wgmma lines are PTX comments ("// @wgmma..."), operands
 * substituted like any inline assembly; the program built from source
 * gives its PTX (CL_PROGRAM_BINARIES), which is unmasked, retargeted to
 * sm_90a and built again from that "binary".
 *
 *   cc -O2 -o /tmp/cl_wgmma bench/probes/cl_wgmma.c -ldl && /tmp/cl_wgmma
 * (OCL_ICD_VENDORS as bench/gpu_env.sh's fa_nvidia_opencl sets it). */
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *source =
    "__kernel __attribute__((reqd_work_group_size(128, 1, 1))) void\n"
    "probe(__global const ushort *a, __global const ushort *b, __global float *d, ulong lbo, ulong sbo) {\n"
    "    __local ushort As[64 * 16] __attribute__((aligned(256)));\n"
    "    __local ushort Bs[8 * 16] __attribute__((aligned(256)));\n"
    "    const int t = get_local_id(0);\n"
    "    /* Element (r, k) of a K-major operand: core matrix (r / 8, k / 8)\n"
    "     * at ((r / 8) * 2 + k / 8) * 64 elements, row r % 8 of it 8 wide. */\n"
    "    for (int i = t; i < 64 * 16; i += 128) {\n"
    "        const int r = i / 16, k = i % 16;\n"
    "        As[((r / 8) * 2 + k / 8) * 64 + (r % 8) * 8 + k % 8] = a[i];\n"
    "    }\n"
    "    if (t < 8 * 16 / 1) {\n"
    "        const int r = t / 16, k = t % 16;\n"
    "        Bs[((r / 8) * 2 + k / 8) * 64 + (r % 8) * 8 + k % 8] = b[t];\n"
    "    }\n"
    "    __asm__ __volatile__(\"fence.proxy.async.shared::cta;\" ::: \"memory\");\n"
    "    barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    const ulong da = (((ulong)(uint)(size_t)As & 0x3FFFF) >> 4) | ((lbo >> 4) << 16) | ((sbo >> 4) << 32);\n"
    "    const ulong db = (((ulong)(uint)(size_t)Bs & 0x3FFFF) >> 4) | ((lbo >> 4) << 16) | ((sbo >> 4) << 32);\n"
    "    float c0 = 0.0f, c1 = 0.0f, c2 = 0.0f, c3 = 0.0f;\n"
    "    __asm__ __volatile__(\"// @wgmma.fence.sync.aligned;\\n\\t\"\n"
    "                         \"// @wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%0, %1, %2, %3}, %4, %5, 0, 1, 1, 0, 0;\\n\\t\"\n"
    "                         \"// @wgmma.commit_group.sync.aligned;\\n\\t\"\n"
    "                         \"// @wgmma.wait_group.sync.aligned 0;\"\n"
    "                         : \"+f\"(c0), \"+f\"(c1), \"+f\"(c2), \"+f\"(c3)\n"
    "                         : \"l\"(da), \"l\"(db)\n"
    "                         : \"memory\");\n"
    "    /* The accumulator as mma.sync's, a warp's 16 rows each. */\n"
    "    const int w = t / 32, l = t % 32, row = 16 * w + l / 4, col = 2 * (l % 4);\n"
    "    d[row * 8 + col] = c0;\n"
    "    d[row * 8 + col + 1] = c1;\n"
    "    d[(row + 8) * 8 + col] = c2;\n"
    "    d[(row + 8) * 8 + col + 1] = c3;\n"
    "}\n";

#define FN(name) static __typeof__(&name) p_##name
FN(clGetPlatformIDs);
FN(clGetDeviceIDs);
FN(clGetDeviceInfo);
FN(clCreateContext);
FN(clCreateCommandQueue);
FN(clCreateProgramWithSource);
FN(clBuildProgram);
FN(clGetProgramBuildInfo);
FN(clGetProgramInfo);
FN(clCreateProgramWithBinary);
FN(clCreateKernel);
FN(clCreateBuffer);
FN(clSetKernelArg);
FN(clEnqueueNDRangeKernel);
FN(clEnqueueReadBuffer);
FN(clFinish);

static unsigned short to_half(float f) {
    /* Small integers and halves only (exact in fp16). */
    if (f == 0.0f) return 0;
    unsigned short sign = f < 0 ? 0x8000 : 0;
    f = fabsf(f);
    int e = 0;
    while (f >= 2.0f) f /= 2.0f, e++;
    while (f < 1.0f) f *= 2.0f, e--;
    return (unsigned short)(sign | (unsigned short)((e + 15) << 10) | (unsigned short)((f - 1.0f) * 1024.0f));
}

int main(void) {
    void *lib = dlopen("libOpenCL.so.1", RTLD_NOW);
    if (!lib) lib = dlopen("libOpenCL.so", RTLD_NOW);
    if (!lib) return printf("no OpenCL library: %s\n", dlerror()), 1;
#define LOAD(name) p_##name = (__typeof__(&name))dlsym(lib, #name)
    LOAD(clGetPlatformIDs);
    LOAD(clGetDeviceIDs);
    LOAD(clGetDeviceInfo);
    LOAD(clCreateContext);
    LOAD(clCreateCommandQueue);
    LOAD(clCreateProgramWithSource);
    LOAD(clBuildProgram);
    LOAD(clGetProgramBuildInfo);
    LOAD(clGetProgramInfo);
    LOAD(clCreateProgramWithBinary);
    LOAD(clCreateKernel);
    LOAD(clCreateBuffer);
    LOAD(clSetKernelArg);
    LOAD(clEnqueueNDRangeKernel);
    LOAD(clEnqueueReadBuffer);
    LOAD(clFinish);
    cl_platform_id plats[8];
    cl_device_id dev = NULL;
    cl_uint np = 0;
    cl_int err = p_clGetPlatformIDs(8, plats, &np);
    for (cl_uint i = 0; !err && i < np && !dev; i++)
        if (p_clGetDeviceIDs(plats[i], CL_DEVICE_TYPE_GPU, 1, &dev, NULL)) dev = NULL;
    if (!dev) return printf("no OpenCL device (clGetPlatformIDs %d, %u platforms)\n", err, np), 1;
    char name[256] = "";
    p_clGetDeviceInfo(dev, CL_DEVICE_NAME, sizeof name, name, NULL);
    printf("device: %s\n", name);
    cl_context ctx = p_clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
    cl_command_queue q = p_clCreateCommandQueue(ctx, dev, 0, &err);
    cl_program prog = p_clCreateProgramWithSource(ctx, 1, &source, NULL, &err);
    /* PROBE_OPTIONS: build options to try (an architecture switch). */
    char opts[512];
    snprintf(opts, sizeof opts, "%s %s", strstr(name, "NVIDIA") ? "-cl-nv-verbose" : "",
             getenv("PROBE_OPTIONS") ? getenv("PROBE_OPTIONS") : "");
    printf("options: %s\n", opts);
    err = p_clBuildProgram(prog, 1, &dev, opts, NULL, NULL);
    static char log[1 << 16];
    p_clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, sizeof log, log, NULL);
    printf("build: %d\n%.3000s\n", err, log);
    if (err) return 1;
    size_t bytes = 0;
    p_clGetProgramInfo(prog, CL_PROGRAM_BINARY_SIZES, sizeof bytes, &bytes, NULL);
    char *ptx = calloc(bytes + 64, 1), *patched = calloc(bytes + 64, 1);
    unsigned char *bins[1] = {(unsigned char *)ptx};
    p_clGetProgramInfo(prog, CL_PROGRAM_BINARIES, sizeof bins, bins, NULL);
    /* Unmask "// @" and retarget. */
    size_t n = 0;
    for (const char *c = ptx; *c;) {
        if (strncmp(c, "// @", 4) == 0) {
            c += 4;
        } else if (strncmp(c, ".target sm_90", 13) == 0 && c[13] != 'a') {
            memcpy(patched + n, ".target sm_90a", 14);
            n += 14;
            c += 13;
        } else {
            patched[n++] = *c++;
        }
    }
    const char *ver = strstr(patched, ".version"), *tgt = strstr(patched, ".target");
    printf("PTX %zu bytes: %.14s, %.16s\n", bytes, ver ? ver : "?", tgt ? tgt : "?");
    const unsigned char *pbin = (const unsigned char *)patched;
    n = strlen(patched) + 1;
    cl_int bstatus = 0;
    prog = p_clCreateProgramWithBinary(ctx, 1, &dev, &n, &pbin, &bstatus, &err);
    if (!err) err = p_clBuildProgram(prog, 1, &dev, opts, NULL, NULL);
    p_clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, sizeof log, log, NULL);
    printf("rebuild from PTX: %d (%d)\n%.3000s\n", err, bstatus, log);
    if (err) return 1;
    cl_kernel k = p_clCreateKernel(prog, "probe", &err);
    unsigned short ha[64 * 16], hb[8 * 16];
    float fa[64 * 16], fb[8 * 16], want[64 * 8], got[64 * 8];
    for (int i = 0; i < 64 * 16; i++) fa[i] = (float)((i * 7 + 3) % 9 - 4), ha[i] = to_half(fa[i]);
    for (int i = 0; i < 8 * 16; i++) fb[i] = (float)((i * 5 + 1) % 7 - 3) * 0.5f, hb[i] = to_half(fb[i]);
    for (int r = 0; r < 64; r++)
        for (int c = 0; c < 8; c++) {
            float s = 0.0f;
            for (int kk = 0; kk < 16; kk++) s += fa[r * 16 + kk] * fb[c * 16 + kk];
            want[r * 8 + c] = s;
        }
    cl_mem ba = p_clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof ha, ha, &err);
    cl_mem bb = p_clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof hb, hb, &err);
    cl_mem bd = p_clCreateBuffer(ctx, CL_MEM_WRITE_ONLY, sizeof got, NULL, &err);
    const cl_ulong offsets[2][2] = {{128, 256}, {256, 128}};
    int any = 0;
    for (int o = 0; o < 2; o++) {
        p_clSetKernelArg(k, 0, sizeof ba, &ba);
        p_clSetKernelArg(k, 1, sizeof bb, &bb);
        p_clSetKernelArg(k, 2, sizeof bd, &bd);
        p_clSetKernelArg(k, 3, sizeof(cl_ulong), &offsets[o][0]);
        p_clSetKernelArg(k, 4, sizeof(cl_ulong), &offsets[o][1]);
        memset(got, 0, sizeof got);
        size_t g = 128, l = 128;
        err = p_clEnqueueNDRangeKernel(q, k, 1, NULL, &g, &l, 0, NULL, NULL);
        if (!err) err = p_clEnqueueReadBuffer(q, bd, CL_TRUE, 0, sizeof got, got, 0, NULL, NULL);
        if (!err) err = p_clFinish(q);
        int bad = 0;
        for (int i = 0; i < 64 * 8; i++) bad += got[i] != want[i];
        if (err) bad = 64 * 8; /* nothing read back */
        printf("offsets (K %llu, M/N %llu): run %d, %d of 512 wrong (d[0] %g want %g, d[9] %g want %g)\n",
               (unsigned long long)offsets[o][0], (unsigned long long)offsets[o][1], err, bad, got[0], want[0],
               got[9], want[9]);
        any |= !err && bad == 0;
    }
    printf("wgmma from OpenCL: %s\n", any ? "works" : "does not work here");
    return any ? 0 : 1;
}
