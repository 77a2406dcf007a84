/* The batch kernel of the CUDA backend, kept here as the source of the PTX
 * that src/backend/cuda_kernel.c embeds (the build needs no CUDA compiler;
 * the driver compiles the PTX when pinmem first launches it). To change it:
 *   nvcc -ptx -arch=compute_75 -O3 cuda_kernel.cu -o -
 * then lower the header to ".version 8.0" and ".target sm_70" (the code uses
 * nothing newer, and every driver pinmem accepts, 12.0 on, takes that ISA),
 * check it with "ptxas -arch=sm_90", and paste it into cuda_kernel.c. */
typedef unsigned long long u64;

struct pm_block { u64 dst, src, bytes; };

template <typename T>
__device__ __forceinline__ void body(char *d, const char *s, u64 n)
{
    T *dt = (T *)d;
    const T *st = (const T *)s;
    const u64 m = n / sizeof(T), step = blockDim.x;
    u64 i = threadIdx.x;
    for (; i + 3 * step < m; i += 4 * step) {
        T a = st[i], b = st[i + step], c = st[i + 2 * step], e = st[i + 3 * step];
        dt[i] = a;
        dt[i + step] = b;
        dt[i + 2 * step] = c;
        dt[i + 3 * step] = e;
    }
    for (; i < m; i += step)
        dt[i] = st[i];
}

__device__ __forceinline__ void copy_range(char *d, const char *s, u64 n)
{
    const unsigned diff = (unsigned)((u64)d ^ (u64)s);
    const unsigned w = (diff & 15) == 0 ? 16 : (diff & 3) == 0 ? 4 : 1;
    u64 head = (w - ((u64)d & (w - 1))) & (w - 1);
    if (head > n)
        head = n;
    const u64 mid = (n - head) & ~(u64)(w - 1), tail = n - head - mid;
    if (threadIdx.x < head)
        d[threadIdx.x] = s[threadIdx.x];
    d += head;
    s += head;
    if (w == 16)
        body<uint4>(d, s, mid);
    else if (w == 4)
        body<unsigned>(d, s, mid);
    else
        body<unsigned char>(d, s, mid);
    if (threadIdx.x < tail)
        d[mid + threadIdx.x] = s[mid + threadIdx.x];
}

extern "C" __global__ void __launch_bounds__(256)
pm_block_copy(const volatile pm_block *blocks, u64 count, unsigned parts)
{
    __shared__ u64 dst, src, bytes;
    const u64 units = count * parts;
    for (u64 u = blockIdx.x; u < units; u += gridDim.x) {
        __syncthreads(); /* every thread is done with the last unit's block */
        if (threadIdx.x == 0) {
            const volatile pm_block *b = &blocks[u / parts];
            dst = b->dst;
            src = b->src;
            bytes = b->bytes;
        }
        __syncthreads();
        /* as pm__block_part_span (block_parts.h) */
        const u64 per = ((bytes + parts - 1) / parts + 15) & ~(u64)15, part = u % parts;
        const u64 lo = part * per < bytes ? part * per : bytes;
        const u64 hi = bytes - lo < per ? bytes : lo + per;
        copy_range((char *)dst + lo, (const char *)src + lo, hi - lo);
    }
}
