/* Whether the batch kernel's shape bounds it: 1,000 scattered blocks between
 * page-locked and device memory moved by kernels that copy as pinmem's does
 * (src/backend/cuda_kernel.cu), unrolled 2-8 loads deep, with 128-512
 * threads a block, 2-8 blocks a multiprocessor, or each block cut into
 * parts, against one contiguous cudaMemcpyAsync of the same bytes: GPU time
 * alone (events around the work), median of 21, each shape twice.
 * nvcc -O3 -arch=sm_90 bench/probe/batch_kernel.cu -o batch_kernel
 * ./batch_kernel [block bytes] */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <algorithm>
#include <vector>
struct Blk { unsigned long long dst, src, bytes; };
template <int UNROLL, int THREADS>
__global__ void __launch_bounds__(THREADS) kcopy(const Blk *list, unsigned long long n, unsigned parts)
{
    const unsigned long long units = n * parts;
    for (unsigned long long u = blockIdx.x; u < units; u += gridDim.x) {
        const Blk b = list[u / parts];
        const unsigned long long per = b.bytes / parts, lo = (u % parts) * per;
        const uint4 *s = (const uint4 *)(b.src + lo);
        uint4 *d = (uint4 *)(b.dst + lo);
        const unsigned long long w = per / 16;
        unsigned long long i = threadIdx.x;
        for (; i + (UNROLL - 1) * THREADS < w; i += UNROLL * THREADS) {
            uint4 a[UNROLL];
#pragma unroll
            for (int k = 0; k < UNROLL; k++) a[k] = s[i + k * THREADS];
#pragma unroll
            for (int k = 0; k < UNROLL; k++) d[i + k * THREADS] = a[k];
        }
        for (; i < w; i += THREADS) d[i] = s[i];
    }
}
#define CK(x) do { cudaError_t e_ = (x); if (e_) { printf("%s: %s\n", #x, cudaGetErrorString(e_)); exit(1);} } while (0)
static float med(std::vector<float> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }
typedef void (*launcher)(const Blk *, unsigned long long, unsigned, int, cudaStream_t);
template <int U, int T> void launch(const Blk *l, unsigned long long n, unsigned parts, int grid, cudaStream_t s)
{ kcopy<U, T><<<grid, T, 0, s>>>(l, n, parts); }
int main(int argc, char **argv)
{
    size_t blk = argc > 1 ? strtoull(argv[1], 0, 0) : 65536;
    int count = 1000, reps = 21, sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    size_t stride = blk * 2, total = blk * count;
    char *h, *d;
    CK(cudaHostAlloc((void **)&h, stride * count, cudaHostAllocDefault));
    CK(cudaMalloc((void **)&d, stride * count));
    std::vector<int> perm(count);
    for (int i = 0; i < count; i++) perm[i] = i;
    srand(1);
    for (int i = count - 1; i > 0; i--) std::swap(perm[i], perm[rand() % (i + 1)]);
    Blk *lists[2];
    for (int dir = 0; dir < 2; dir++) {
        CK(cudaMalloc((void **)&lists[dir], sizeof(Blk) * count));
        std::vector<Blk> v(count);
        for (int i = 0; i < count; i++) {
            unsigned long long hp = (unsigned long long)(h + (size_t)i * stride);
            unsigned long long dp = (unsigned long long)(d + (size_t)perm[i] * stride);
            v[i] = dir == 0 ? Blk{dp, hp, blk} : Blk{hp, dp, blk};
        }
        CK(cudaMemcpy(lists[dir], v.data(), sizeof(Blk) * count, cudaMemcpyHostToDevice));
    }
    char *hc, *dc;
    CK(cudaHostAlloc((void **)&hc, total, cudaHostAllocDefault));
    CK(cudaMalloc((void **)&dc, total));
    cudaStream_t s; CK(cudaStreamCreate(&s));
    cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    struct V { const char *name; launcher f; int per_sm; unsigned parts; } vs[] = {
        {"u4 t256 sm4 p1 (shipped)", launch<4, 256>, 4, 1},
        {"u8 t256 sm4 p1", launch<8, 256>, 4, 1},
        {"u4 t512 sm2 p1", launch<4, 512>, 2, 1},
        {"u4 t256 sm8 p1", launch<4, 256>, 8, 1},
        {"u4 t256 sm4 p4", launch<4, 256>, 4, 4},
        {"u8 t128 sm8 p1", launch<8, 128>, 8, 1},
        {"u2 t256 sm8 p1", launch<2, 256>, 8, 1},
        {"u4 t256 sm2 p1", launch<4, 256>, 2, 1},
    };
    for (int dir = 0; dir < 2; dir++) {
        std::vector<float> t;
        for (int r = 0; r < reps; r++) {
            CK(cudaEventRecord(e0, s));
            CK(cudaMemcpyAsync(dir ? hc : dc, dir ? dc : hc, total, dir ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, s));
            CK(cudaEventRecord(e1, s)); CK(cudaEventSynchronize(e1));
            float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); t.push_back(ms);
        }
        float contig = med(t);
        printf("%s %zu KiB x %d: contiguous %.1f GB/s\n", dir ? "dtoh" : "htod", blk >> 10, count, total / contig / 1e6);
        for (int round = 0; round < 2; round++)
        for (auto &v : vs) {
            t.clear();
            for (int r = 0; r < reps; r++) {
                int grid = std::min<long long>((long long)sms * v.per_sm, (long long)count * v.parts);
                CK(cudaEventRecord(e0, s));
                v.f(lists[dir], count, v.parts, grid, s);
                CK(cudaEventRecord(e1, s)); CK(cudaEventSynchronize(e1));
                float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); t.push_back(ms);
            }
            printf("  %-26s %.1f%% of contiguous\n", v.name, 100 * contig / med(t));
        }
    }
    return 0;
}
