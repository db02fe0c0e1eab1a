/*
 * bench_gather.cu — how fast the GPU reads a decode step's paged KV cache
 * when nothing but the reads is done: the ceiling of the access pattern,
 * apart from any attention math, beside the flat read of the same bytes.
 *
 * The cache is bench_decode's: NHD pages of 16 tokens x 8 KV heads x 128
 * bf16 (32 KB of K and 32 KB of V per page), random bytes (never zeros), a
 * pool of `pool` pages per cache; a batch of B requests x L keys whose pages
 * are drawn at random from the pool (never twice), or consecutive per
 * request. The reads (16-byte cp.async into shared-memory stages, as the
 * kernels do; a ring of 3 stages, the next tile issued once the current one
 * is read back: up to 2 tiles in flight per CTA, as in the decode form):
 *   head    a CTA per (KV head, worker), 128 threads, 2 CTAs per SM, tiles
 *           of 64 keys of one head: 16 rows of 256 bytes per page, 2 KB
 *           apart (the decode form of kernels/decode_tc.cuh)
 *   4 heads a CTA per (4 KV heads, worker), 128 threads, 2 CTAs per SM,
 *           tiles of 16 keys: 1 KB runs
 *   page    a CTA per worker, 256 threads, 1 CTA per SM, tiles of one page
 *           with every head: K and V each one 32 KB run
 *   flat    the same number of bytes from one run of each cache
 * First, the ceiling the decode targets are stated against (docs/BENCHMARKS.md): a
 * device-to-device cudaMemcpy of 2 GiB, bytes read + written, on this
 * machine in this run (the JSON's "d2d copy" row; report_peers.py's %).
 * Last, the depth: the "head" form with 32 to 96 KB of K + V in flight per
 * CTA (64-key tiles, 1 or 2 in flight; 32-key tiles, 2, 4 or 6), on the
 * cells of at most 4096 pages (JSON forms "head, in flight TKxN"); and the
 * "head" form by bulk copies, a row each (read_bulk; "head bulk, ..."), and
 * by the tensor memory accelerator, a page's 16 rows per box (read_tma;
 * "head tma4k, ...": 4 KB boxes; "head tma2k, ...": 2 KB swizzled boxes).
 * Worker w of W reads pages [w P / W, (w + 1) P / W) of the batch's P
 * pages, so every form reads the same bytes, evenly spread. Time: device
 * events around each launch, median of 50 after 5 warm-ups; TB/s decimal.
 *
 *   make build/bench_gather    (nvcc)
 *   build/bench_gather [--json FILE] [B L pool ...]
 *   build/bench_gather --copy-only     (the 2 GiB copy ceiling alone)
 *       default cells: 16 x 4096 and 64 x 1024 from pools of 65536 pages (4
 *       GiB, bench_decode's) and 4096; 1 x 32768, 256 x 4096 from 65536
 */
#include <cuda.h> /* CUtensorMap (the TMA form; the encoder through the runtime's entry point) */
#include <cuda_runtime.h>

#include <algorithm>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#define CK(x)                                                                                  \
    do {                                                                                       \
        cudaError_t e_ = (x);                                                                  \
        if (e_ != cudaSuccess) {                                                               \
            printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));          \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

enum { PS = 16, HKV = 8, D = 128, ROW = D * 2, PAGE_BYTES = PS * HKV * ROW, STAGES = 3 };

__global__ void fill(uint4 *p, size_t n, unsigned seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        unsigned x = (unsigned)i * 2654435761u ^ seed;
        x ^= x >> 13, x *= 0x5bd1e995u, x ^= x >> 15;
        p[i] = make_uint4(x | 1, x * 3 + 1, x ^ 0x9e3779b9u, x + 7);
    }
}

__device__ __forceinline__ void cp16(char *dst, const char *src) {
    unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src));
}

/* G adjacent KV heads per CTA, tiles of TK keys: a stage holds TK x G rows
 * of 256 bytes of K, then the same of V; a ring of S stages (up to S - 1
 * tiles in flight). Grid (8 / G head groups, W). */
template <int NT, int TK, int G, int S = STAGES>
__global__ void __launch_bounds__(NT) read_paged(const char *k, const char *v, const int *indices,
                                                 int P, unsigned *sink) {
    extern __shared__ __align__(16) char sm[];
    const int W = gridDim.y, w = blockIdx.y, h = blockIdx.x * G;
    const int p0 = (int)((long)w * P / W), p1 = (int)((long)(w + 1) * P / W);
    constexpr int HALF = TK * G * ROW, PER = HALF / 16 / NT, CPK = G * ROW / 16; /* chunks per key */
    static_assert(PER * 16 * NT == HALF, "whole chunks per thread");
    const int ntiles = ((p1 - p0) * PS + TK - 1) / TK;
    auto issue = [&](int t) {
        char *st = sm + (t % S) * 2 * HALF;
#pragma unroll
        for (int i = 0; i < PER; i++) {
            const int c = i * NT + threadIdx.x; /* 16-byte chunk of the tile's K (and V) */
            const int key = t * TK + c / CPK;
            const int pg = indices[min(p0 + key / PS, p1 - 1)];
            const size_t off = (size_t)pg * PAGE_BYTES + ((key % PS) * HKV + h) * ROW + (c % CPK) * 16;
            cp16(st + c * 16, k + off);
            cp16(st + HALF + c * 16, v + off);
        }
    };
    unsigned acc = 0;
    for (int t = 0; t < S - 1; t++) {
        if (t < ntiles) issue(t);
        asm volatile("cp.async.commit_group;");
    }
    for (int t = 0; t < ntiles; t++) {
        asm volatile("cp.async.wait_group %0;" ::"n"(S - 2));
        __syncthreads();
        const char *st = sm + (t % S) * 2 * HALF;
        acc += *(const unsigned *)(st + threadIdx.x * 16) ^ *(const unsigned *)(st + HALF + threadIdx.x * 16);
        __syncthreads();
        if (t + S - 1 < ntiles) issue(t + S - 1);
        asm volatile("cp.async.commit_group;");
    }
    asm volatile("cp.async.wait_group 0;");
    if (acc == 0x12345678u) sink[threadIdx.x] = acc; /* never on random data: no load is dead */
}

/* The bulk and TMA forms' stage barriers (shared addresses): thread 0
 * initialises n of them (one arrival each), then the CTA syncs; the issuing
 * thread's arrival expects `bytes`; a wait spins on a phase's parity. */
__device__ __forceinline__ void mbar_init(unsigned bar0, int n) {
    if (threadIdx.x == 0) {
        for (int s = 0; s < n; s++) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar0 + 8 * s));
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
}
__device__ __forceinline__ void mbar_expect(unsigned bar, int bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned bar, int parity) {
    asm volatile("{\n .reg .pred done;\nWAIT:\n mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 " @!done bra WAIT;\n}" ::"r"(bar),
                 "r"(parity)
                 : "memory");
}

/* The same reads as read_paged<128, 64, 1, S> (one head per CTA, 64-key
 * tiles, up to S - 1 in flight), each K or V row one bulk copy
 * (cp.async.bulk, 256 bytes) by one thread, counted on the stage's
 * mbarrier; rows padded to 272 bytes (as the decode form of branch
 * wip/dtc-bulk did: docs/CUDA_KERNELS.md, "Bulk copies, ..."). */
template <int S>
__global__ void __launch_bounds__(128) read_bulk(const char *k, const char *v, const int *indices, int P,
                                                 unsigned *sink) {
    extern __shared__ __align__(16) char sm[];
    __shared__ __align__(8) unsigned long long bar[S];
    constexpr int TK = 64, PITCH = ROW + 16, HALF = TK * PITCH;
    const int W = gridDim.y, w = blockIdx.y, h = blockIdx.x;
    const int p0 = (int)((long)w * P / W), p1 = (int)((long)(w + 1) * P / W);
    const int nkeys = (p1 - p0) * PS, ntiles = (nkeys + TK - 1) / TK;
    const int key = threadIdx.x % TK, is_v = threadIdx.x / TK;
    const unsigned bar0 = (unsigned)__cvta_generic_to_shared(bar);
    mbar_init(bar0, S);
    auto issue = [&](int t) {
        const unsigned b = bar0 + 8 * (t % S);
        const unsigned dst = (unsigned)__cvta_generic_to_shared(sm + (t % S) * 2 * HALF + is_v * HALF + key * PITCH);
        const int j = t * TK + key, nk = min(TK, nkeys - t * TK);
        if (threadIdx.x == 0) mbar_expect(b, nk * 2 * ROW);
        if (j < nkeys) {
            const size_t off = (size_t)indices[p0 + j / PS] * PAGE_BYTES + ((j % PS) * HKV + h) * ROW;
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                         ::"r"(dst), "l"((is_v ? v : k) + off), "r"(ROW), "r"(b)
                         : "memory");
        }
    };
    unsigned acc = 0;
    for (int t = 0; t < S - 1 && t < ntiles; t++) issue(t);
    for (int t = 0; t < ntiles; t++) {
        mbar_wait(bar0 + 8 * (t % S), (t / S) & 1);
        const char *st = sm + (t % S) * 2 * HALF;
        acc += *(const unsigned *)(st + threadIdx.x * 16) ^ *(const unsigned *)(st + HALF + threadIdx.x * 16);
        __syncthreads();
        if (t + S - 1 < ntiles) issue(t + S - 1);
    }
    if (acc == 0x12345678u) sink[threadIdx.x] = acc;
}

/* The same reads as read_paged<128, 64, 1, S> by the tensor memory
 * accelerator: thread 0 issues, per page of a 64-key tile, one
 * cp.async.bulk.tensor box of 16 rows of K and one of V (BOXW = 128: a
 * 4 KB box, rows unswizzled) or two of each (BOXW = 64: 2 KB boxes, rows of
 * 128 bytes with the 128-byte swizzle, the layout an ldmatrix-fed kernel
 * would read), counted in bytes on the stage's mbarrier. The cache as a
 * 3-D tensor {128 columns, 8 heads (256 B apart), tokens (2 KB apart)}. */
template <int S, int BOXW>
__global__ void __launch_bounds__(128) read_tma(const __grid_constant__ CUtensorMap tk,
                                                const __grid_constant__ CUtensorMap tv, const int *indices,
                                                int P, unsigned *sink) {
    extern __shared__ __align__(16) char sm[];
    __shared__ __align__(8) unsigned long long bar[S];
    constexpr int TK = 64, HALF = TK * ROW, BOX = PS * BOXW * 2;
    const int W = gridDim.y, w = blockIdx.y, h = blockIdx.x;
    const int p0 = (int)((long)w * P / W), p1 = (int)((long)(w + 1) * P / W);
    const int ntiles = ((p1 - p0) * PS + TK - 1) / TK;
    const unsigned bar0 = (unsigned)__cvta_generic_to_shared(bar);
    unsigned sm0 = (unsigned)__cvta_generic_to_shared(sm);
    sm0 = (sm0 + 1023) & ~1023u; /* the swizzle's pattern repeats every 1 KB: boxes 1 KB-aligned */
    mbar_init(bar0, S);
    auto issue = [&](int t) { /* thread 0 */
        const unsigned b = bar0 + 8 * (t % S), st = sm0 + (t % S) * 2 * HALF;
        const int q0 = p0 + t * (TK / PS), np = min(TK / PS, p1 - q0);
        mbar_expect(b, np * 2 * PS * ROW);
        for (int i = 0; i < np; i++) {
            const int tok = indices[q0 + i] * PS;
            for (int c = 0; c < 128 / BOXW; c++) {
                const unsigned off = (c * (TK / PS) + i) * BOX; /* [column block][page][16 rows] */
                asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                             " [%0], [%1, {%3, %4, %5}], [%2];" ::"r"(st + off),
                             "l"(&tk), "r"(b), "r"(c * BOXW), "r"(h), "r"(tok)
                             : "memory");
                asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                             " [%0], [%1, {%3, %4, %5}], [%2];" ::"r"(st + HALF + off),
                             "l"(&tv), "r"(b), "r"(c * BOXW), "r"(h), "r"(tok)
                             : "memory");
            }
        }
    };
    unsigned acc = 0;
    if (threadIdx.x == 0)
        for (int t = 0; t < S - 1 && t < ntiles; t++) issue(t);
    for (int t = 0; t < ntiles; t++) {
        mbar_wait(bar0 + 8 * (t % S), (t / S) & 1);
        const char *st = sm + (sm0 - (unsigned)__cvta_generic_to_shared(sm)) + (t % S) * 2 * HALF;
        acc += *(const unsigned *)(st + threadIdx.x * 16) ^ *(const unsigned *)(st + HALF + threadIdx.x * 16);
        __syncthreads();
        if (threadIdx.x == 0 && t + S - 1 < ntiles) issue(t + S - 1);
    }
    if (acc == 0x12345678u) sink[threadIdx.x] = acc;
}

__device__ __forceinline__ uint4 ld16(const char *p) { /* streamed: not kept in L1 */
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

/* flat: `bytes` from the start of each cache, 16 bytes per load, 8 in flight */
__global__ void read_flat(const char *k, const char *v, size_t bytes, unsigned *sink) {
    unsigned acc = 0;
    const size_t step = (size_t)gridDim.x * blockDim.x * 16;
    for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 16; i < bytes; i += 4 * step) {
        uint4 x[8];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const size_t j = i + u * step < bytes ? i + u * step : i;
            x[2 * u] = ld16(k + j), x[2 * u + 1] = ld16(v + j);
        }
#pragma unroll
        for (int u = 0; u < 8; u++) acc += x[u].x ^ x[u].y ^ x[u].z ^ x[u].w;
    }
    if (acc == 0x12345678u) sink[threadIdx.x] = acc;
}

template <class F> static double median_us(F launch) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<float> t;
    for (int i = 0; i < 55; i++) {
        CK(cudaEventRecord(a));
        launch();
        CK(cudaGetLastError());
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        if (i >= 5) t.push_back(ms);
    }
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    std::sort(t.begin(), t.end());
    return 1e3 * t[t.size() / 2];
}

/* One form: NT threads, TK keys, G heads, S stages, `per_sm` CTAs per SM
 * (its shared memory sized so), `workers` workers. */
template <int NT, int TK, int G, int S = STAGES>
static double time_paged(const char *k, const char *v, const int *di, int P, int per_sm, int workers,
                         unsigned *sink) {
    auto f = read_paged<NT, TK, G, S>;
    constexpr int need = S * 2 * TK * G * ROW; /* the 3-stage forms: 100 KB, as always */
    const int smem = per_sm == 1 ? 200 * 1024 : need > 100 * 1024 ? 112 * 1024 : 100 * 1024;
    static_assert(S * 2 * TK * G * ROW <= 112 * 1024 || NT == 256, "stages fit");
    CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    return median_us([&] { f<<<dim3(HKV / G, workers), NT, smem>>>(k, v, di, P, sink); });
}

template <int S>
static double time_bulk(const char *k, const char *v, const int *di, int P, int workers, unsigned *sink) {
    auto f = read_bulk<S>;
    const int smem = S * 2 * 64 * (ROW + 16); /* 3 stages: 102 KB, 2 CTAs per SM */
    static_assert(S * 2 * 64 * (ROW + 16) <= 110 * 1024, "2 CTAs per SM");
    CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    return median_us([&] { f<<<dim3(HKV, workers), 128, smem>>>(k, v, di, P, sink); });
}

/* A cache as the TMA's 3-D tensor {128 columns, 8 heads, pool x 16 tokens},
 * boxes of {BOXW, 1, 16} (BOXW = 64: 128-byte swizzle). */
static CUtensorMap tensor_map(const char *base, int pool, int boxw) {
    typedef CUresult (*encode_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                  const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                  CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
    static encode_fn encode = NULL;
    if (!encode) {
        cudaDriverEntryPointQueryResult q;
        void *fn = NULL;
        CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q));
        if (q != cudaDriverEntryPointSuccess || !fn) {
            printf("cuTensorMapEncodeTiled: not found\n");
            exit(1);
        }
        encode = (encode_fn)fn;
    }
    CUtensorMap m;
    const cuuint64_t dims[3] = {D, HKV, (cuuint64_t)pool * PS}, strides[2] = {ROW, HKV * ROW};
    const cuuint32_t box[3] = {(cuuint32_t)boxw, 1, PS}, elem[3] = {1, 1, 1};
    const CUresult r = encode(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, (void *)base, dims, strides, box, elem,
                              CU_TENSOR_MAP_INTERLEAVE_NONE,
                              boxw == 64 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        printf("cuTensorMapEncodeTiled: error %d\n", (int)r);
        exit(1);
    }
    return m;
}

template <int S, int BOXW>
static double time_tma(const CUtensorMap &tk, const CUtensorMap &tv, const int *di, int P, int workers,
                       unsigned *sink) {
    auto f = read_tma<S, BOXW>;
    const int smem = S * 2 * 64 * ROW + 1024; /* 3 stages: 97 KB, 2 CTAs per SM; + alignment slack */
    static_assert(S * 2 * 64 * ROW + 1024 <= 112 * 1024, "2 CTAs per SM");
    CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    return median_us([&] { f<<<dim3(HKV, workers), 128, smem>>>(tk, tv, di, P, sink); });
}

/* The ceiling the decode targets are stated against (docs/BENCHMARKS.md): a
 * device-to-device copy of `bytes` from src, bytes read + written. */
static double copy_ceiling(const char *src, size_t bytes, FILE *jf) {
    char *dst;
    CK(cudaMalloc(&dst, bytes));
    const double t = median_us([&] { CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice)); });
    CK(cudaFree(dst));
    const double tb_s = 2.0 * bytes / t * 1e-6;
    printf("device-to-device copy of %.2f GB: %.1f us, %.3f TB/s (read + written)\n\n", bytes * 1e-9, t, tb_s);
    if (jf) fprintf(jf, "  {\"form\": \"d2d copy\", \"bytes\": %zu, \"us\": %.2f, \"tb_s\": %.3f}", bytes, t, tb_s);
    return tb_s;
}

static unsigned rng_state = 12345;
static unsigned rnd(void) {
    rng_state = rng_state * 1664525u + 1013904223u;
    return rng_state >> 8;
}

/* P page ids from a pool: consecutive from a random start, or the first P
 * of a random permutation (never a page twice); on the device. */
static int *upload_pages(int pool, int P, int contiguous) {
    std::vector<int> perm(pool), idx(P);
    for (int i = 0; i < pool; i++) perm[i] = i;
    const int start = (int)(rnd() % pool);
    for (int i = 0; i < P; i++) {
        if (contiguous) { idx[i] = (start + i) % pool; continue; }
        std::swap(perm[i], perm[i + (int)(rnd() % (unsigned)(pool - i))]);
        idx[i] = perm[i];
    }
    int *di;
    CK(cudaMalloc(&di, idx.size() * 4));
    CK(cudaMemcpy(di, idx.data(), idx.size() * 4, cudaMemcpyHostToDevice));
    return di;
}

/* One table cell (us, TB/s) and its JSON row (after the copy's row). */
static void print_time(FILE *jf, int B, int L, int pool, const char *pages, const char *form, double us,
                       double bytes) {
    printf(" %.1f, %.2f |", us, bytes / us * 1e-6);
    if (jf)
        fprintf(jf,
                ",\n  {\"batch\": %d, \"kv_len\": %d, \"pool_pages\": %d, \"pages\": \"%s\", "
                "\"form\": \"%s\", \"us\": %.2f, \"tb_s\": %.3f}",
                B, L, pool, pages, form, us, bytes / us * 1e-6);
}

int main(int argc, char **argv) {
    const char *json = NULL;
    int copy_only = 0;
    std::vector<int> cells; /* B, L, pool */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
        else if (!strcmp(argv[i], "--copy-only")) copy_only = 1;
        else cells.push_back(atoi(argv[i]));
    }
    if (cells.size() < 3)
        cells = {16, 4096, 65536, 64, 1024, 65536, 16, 4096, 4096, 64, 1024, 4096,
                 1,  32768, 65536, 256, 4096, 65536};
    cells.resize(cells.size() / 3 * 3);
    int max_pool = 0, sms = 0;
    for (size_t c = 0; c < cells.size(); c += 3) {
        if (cells[c] < 1 || cells[c + 1] < PS || (long)cells[c] * (cells[c + 1] / PS) > cells[c + 2]) {
            printf("cell %d x %d: needs a pool of at least its pages\n", cells[c], cells[c + 1]);
            return 1;
        }
        max_pool = std::max(max_pool, cells[c + 2]);
    }
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    if (copy_only) { /* the ceiling alone, on 2 GiB of random bytes */
        const size_t cb = (size_t)2 << 30;
        char *src;
        CK(cudaMalloc(&src, cb));
        fill<<<1024, 256>>>((uint4 *)src, cb / 16, 3);
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        copy_ceiling(src, cb, NULL);
        CK(cudaFree(src));
        return 0;
    }
    char *k, *v;
    unsigned *sink;
    const size_t pool_bytes = (size_t)max_pool * PAGE_BYTES;
    CK(cudaMalloc(&k, pool_bytes));
    CK(cudaMalloc(&v, pool_bytes));
    CK(cudaMalloc(&sink, 256 * 4));
    fill<<<1024, 256>>>((uint4 *)k, pool_bytes / 16, 1);
    fill<<<1024, 256>>>((uint4 *)v, pool_bytes / 16, 2);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    /* flat: the whole L1 (no shared memory), whatever the paged forms set
     * before it; with their carveout it streamed 5-7% slower */
    CK(cudaFuncSetAttribute(read_flat, cudaFuncAttributePreferredSharedMemoryCarveout, 0));
    FILE *jf = json ? fopen(json, "w") : NULL;
    if (jf) fprintf(jf, "[\n");
    copy_ceiling(k, std::min(pool_bytes, (size_t)2 << 30), jf);
    printf("loads only, %d SMs; us and TB/s (decimal)\n\n", sms);
    printf("| B x L | pool (pages) | pages | head | 4 heads | page | flat |\n|---|---|---|---|---|---|---|\n");
    const char *names[4] = {"head", "4 heads", "page", "flat"};
    for (size_t c = 0; c < cells.size(); c += 3) {
        const int B = cells[c], L = cells[c + 1], pool = cells[c + 2], ppr = L / PS, P = B * ppr;
        for (int contiguous = 0; contiguous < 2; contiguous++) {
            int *di = upload_pages(pool, P, contiguous);
            const double bytes = 2.0 * P * PAGE_BYTES;
            double t[4];
            t[0] = time_paged<128, 64, 1>(k, v, di, P, 2, 2 * sms / HKV, sink);
            t[1] = time_paged<128, 16, 4>(k, v, di, P, 2, 2 * sms / (HKV / 4), sink);
            t[2] = time_paged<256, 16, 8>(k, v, di, P, 1, sms, sink);
            t[3] = median_us([&] { read_flat<<<8 * sms, 256>>>(k, v, (size_t)P * PAGE_BYTES, sink); });
            const char *layout = contiguous ? "contiguous" : "random";
            printf("| %d x %d | %d | %s |", B, L, pool, layout);
            for (int f = 0; f < 4; f++) print_time(jf, B, L, pool, layout, names[f], t[f], bytes);
            printf("\n");
            CK(cudaFree(di));
        }
    }
    /* How the reads alone take depth: one head per CTA (the decode form's
     * CTA), 2 CTAs per SM, K + V bytes in flight per CTA from 32 to 96 KB,
     * in 64-key tiles (1 or 2 in flight) or 32-key tiles (2, 4, 6): does a
     * deeper pipeline read these pages faster? Random pages, the cells of at
     * most 4096 pages. */
    printf("\nK + V in flight per CTA (one head per CTA, 2 CTAs per SM, random pages); us and TB/s\n\n");
    printf("| B x L | pool (pages) | 32 KB (64-key tiles x 1) | 32 KB (32 x 2) | 64 KB (64 x 2) | "
           "64 KB (32 x 4) | 96 KB (32 x 6) | bulk 32 KB (64 x 1) | bulk 64 KB (64 x 2) | "
           "TMA 32 KB (4 KB boxes) | TMA 64 KB (4 KB boxes) | TMA 32 KB (2 KB swizzled) | TMA 64 KB (2 KB swizzled) |\n"
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    const CUtensorMap tk4 = tensor_map(k, max_pool, 128), tv4 = tensor_map(v, max_pool, 128);
    const CUtensorMap tk2 = tensor_map(k, max_pool, 64), tv2 = tensor_map(v, max_pool, 64);
    const char *depths[11] = {"head, in flight 64x1", "head, in flight 32x2", "head, in flight 64x2",
                             "head, in flight 32x4", "head, in flight 32x6", "head bulk, in flight 64x1",
                             "head bulk, in flight 64x2", "head tma4k, in flight 64x1",
                             "head tma4k, in flight 64x2", "head tma2k, in flight 64x1",
                             "head tma2k, in flight 64x2"};
    for (size_t c = 0; c < cells.size(); c += 3) {
        const int B = cells[c], L = cells[c + 1], pool = cells[c + 2], P = B * (L / PS);
        if (P > 4096) continue;
        int *di = upload_pages(pool, P, 0);
        const double bytes = 2.0 * P * PAGE_BYTES;
        const int W = 2 * sms / HKV;
        double t[11];
        t[0] = time_paged<128, 64, 1, 2>(k, v, di, P, 2, W, sink);
        t[1] = time_paged<128, 32, 1, 3>(k, v, di, P, 2, W, sink);
        t[2] = time_paged<128, 64, 1, 3>(k, v, di, P, 2, W, sink);
        t[3] = time_paged<128, 32, 1, 5>(k, v, di, P, 2, W, sink);
        t[4] = time_paged<128, 32, 1, 7>(k, v, di, P, 2, W, sink);
        t[5] = time_bulk<2>(k, v, di, P, W, sink);
        t[6] = time_bulk<3>(k, v, di, P, W, sink);
        t[7] = time_tma<2, 128>(tk4, tv4, di, P, W, sink);
        t[8] = time_tma<3, 128>(tk4, tv4, di, P, W, sink);
        t[9] = time_tma<2, 64>(tk2, tv2, di, P, W, sink);
        t[10] = time_tma<3, 64>(tk2, tv2, di, P, W, sink);
        printf("| %d x %d | %d |", B, L, pool);
        for (int f = 0; f < 11; f++) print_time(jf, B, L, pool, "random", depths[f], t[f], bytes);
        printf("\n");
        CK(cudaFree(di));
    }
    if (jf) fprintf(jf, "\n]\n"), fclose(jf);
    return 0;
}
