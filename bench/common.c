/* common.c — clock, medians, bandwidth and FMA probes, random paged batches. */
#include "common.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double bench_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ----------------------------------------------------- bandwidth probe */

typedef struct read_job {
    const uint64_t *data;
    size_t n;
    uint64_t sum;
} read_job;

static uint64_t read_avx512(const uint64_t *p, size_t n);

static void *read_worker(void *arg) {
    read_job *j = arg;
#if defined(__x86_64__) && defined(__GNUC__)
    if (__builtin_cpu_supports("avx512f")) {
        j->sum = read_avx512(j->data, j->n);
        return NULL;
    }
#endif
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i + 4 <= j->n; i += 4) {
        s0 += j->data[i];
        s1 += j->data[i + 1];
        s2 += j->data[i + 2];
        s3 += j->data[i + 3];
    }
    j->sum = s0 + s1 + s2 + s3;
    return NULL;
}

double bench_read_bandwidth(int threads) {
    const size_t bytes = (size_t)1 << 30; /* 1 GiB: far beyond the caches */
    size_t n = bytes / 8;
    uint64_t *buf = malloc(bytes);
    if (!buf) return 0.0;
    for (size_t i = 0; i < n; i++) buf[i] = i * 0x9e3779b97f4a7c15ull;
    if (threads < 1) threads = 1;
    if (threads > 256) threads = 256;
    pthread_t tid[256];
    read_job job[256];
    double best = 0.0;
    for (int pass = 0; pass < 5; pass++) {
        double t0 = bench_now();
        for (int t = 0; t < threads; t++) {
            job[t].data = buf + n / threads * t;
            job[t].n = n / threads;
            pthread_create(&tid[t], NULL, read_worker, &job[t]);
        }
        uint64_t sum = 0;
        for (int t = 0; t < threads; t++) {
            pthread_join(tid[t], NULL);
            sum += job[t].sum;
        }
        double gbs = (double)bytes / (bench_now() - t0) / 1e9;
        if (gbs > best && sum != 1) best = gbs; /* sum keeps the reads alive */
    }
    free(buf);
    return best;
}

/* ------------------------------------------------------------ FMA probe */

#define FMA_CHAINS 12 /* independent accumulators: enough to cover FMA latency */
#define FMA_ITERS 4000000

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

/* 12 independent chains, written out so they stay in registers. */
#define FMA12(fma, a, b)                                                        \
    do {                                                                        \
        x0 = fma(x0, a, b); x1 = fma(x1, a, b); x2 = fma(x2, a, b);             \
        x3 = fma(x3, a, b); x4 = fma(x4, a, b); x5 = fma(x5, a, b);             \
        x6 = fma(x6, a, b); x7 = fma(x7, a, b); x8 = fma(x8, a, b);             \
        x9 = fma(x9, a, b); x10 = fma(x10, a, b); x11 = fma(x11, a, b);         \
    } while (0)

__attribute__((target("avx512f"))) static double fma_avx512(void) {
    /* Distinct starts: equal chains would let the compiler compute one. */
#define S512(k) _mm512_set1_ps(0.1f + 0.01f * (k))
    __m512 x0 = S512(0), x1 = S512(1), x2 = S512(2), x3 = S512(3), x4 = S512(4), x5 = S512(5);
    __m512 x6 = S512(6), x7 = S512(7), x8 = S512(8), x9 = S512(9), x10 = S512(10), x11 = S512(11);
    const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
    for (int it = 0; it < FMA_ITERS; it++) FMA12(_mm512_fmadd_ps, a, b);
    __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(x0, x1), _mm512_add_ps(x2, x3)),
                             _mm512_add_ps(_mm512_add_ps(x4, x5), _mm512_add_ps(x6, x7)));
    s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(x8, x9), _mm512_add_ps(x10, x11)));
    return _mm512_reduce_add_ps(s) == 12345.0f ? 0.0 : 2.0 * 16 * FMA_CHAINS * (double)FMA_ITERS;
}

__attribute__((target("avx2,fma"))) static double fma_avx2(void) {
#define S256(k) _mm256_set1_ps(0.1f + 0.01f * (k))
    __m256 x0 = S256(0), x1 = S256(1), x2 = S256(2), x3 = S256(3), x4 = S256(4), x5 = S256(5);
    __m256 x6 = S256(6), x7 = S256(7), x8 = S256(8), x9 = S256(9), x10 = S256(10), x11 = S256(11);
    const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
    for (int it = 0; it < FMA_ITERS; it++) FMA12(_mm256_fmadd_ps, a, b);
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(x0, x1), _mm256_add_ps(x2, x3)),
                             _mm256_add_ps(_mm256_add_ps(x4, x5), _mm256_add_ps(x6, x7)));
    s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(x8, x9), _mm256_add_ps(x10, x11)));
    float lanes[8], t = 0.0f;
    _mm256_storeu_ps(lanes, s);
    for (int l = 0; l < 8; l++) t += lanes[l];
    return t == 12345.0f ? 0.0 : 2.0 * 8 * FMA_CHAINS * (double)FMA_ITERS;
}

/* Streaming read with 64-byte loads and 4 accumulators. */
__attribute__((target("avx512f"))) static uint64_t read_avx512(const uint64_t *p, size_t n) {
    __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i + 32 <= n; i += 32) {
        s0 = _mm512_add_epi64(s0, _mm512_loadu_si512(p + i));
        s1 = _mm512_add_epi64(s1, _mm512_loadu_si512(p + i + 8));
        s2 = _mm512_add_epi64(s2, _mm512_loadu_si512(p + i + 16));
        s3 = _mm512_add_epi64(s3, _mm512_loadu_si512(p + i + 24));
    }
    s0 = _mm512_add_epi64(_mm512_add_epi64(s0, s1), _mm512_add_epi64(s2, s3));
    return (uint64_t)_mm512_reduce_add_epi64(s0);
}
#endif

/* Portable fallback: scalar multiply-adds (a lower bound of the peak). */
static double fma_scalar(void) {
    float acc[FMA_CHAINS];
    for (int c = 0; c < FMA_CHAINS; c++) acc[c] = (float)c * 1e-3f;
    for (int it = 0; it < FMA_ITERS; it++)
        for (int c = 0; c < FMA_CHAINS; c++) acc[c] = acc[c] * 0.999999f + 1e-7f;
    float s = 0.0f;
    for (int c = 0; c < FMA_CHAINS; c++) s += acc[c];
    return s == 12345.0f ? 0.0 : 2.0 * FMA_CHAINS * (double)FMA_ITERS;
}

/* Runs the widest probe the CPU has; returns flops done. */
static double fma_probe(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return fma_avx512();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return fma_avx2();
#endif
    return fma_scalar();
}

static void *fma_worker(void *arg) {
    *(double *)arg = fma_probe();
    return NULL;
}

/* The best of three passes: a shared machine only ever slows a pass down. */
double bench_fma_peak(int threads) {
    if (threads < 1) threads = 1;
    if (threads > 256) threads = 256;
    pthread_t tid[256];
    double flops[256], best = 0.0;
    for (int pass = 0; pass < 3; pass++) {
        double t0 = bench_now();
        for (int t = 0; t < threads; t++) pthread_create(&tid[t], NULL, fma_worker, &flops[t]);
        double total = 0.0;
        for (int t = 0; t < threads; t++) {
            pthread_join(tid[t], NULL);
            total += flops[t];
        }
        double gflops = total / (bench_now() - t0) / 1e9;
        if (gflops > best) best = gflops;
    }
    return best;
}

/* ------------------------------------------------------------- batches */

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform values in [-1, 1) stored in dtype (bf16/f16 by truncating f32). */
static void fill_random(void *p, fi_dtype dtype, int64_t n, uint64_t *seed) {
    for (int64_t i = 0; i < n; i++) {
        float x = (float)((double)(splitmix(seed) >> 11) * 0x1.0p-53 * 2.0 - 1.0);
        uint32_t u;
        memcpy(&u, &x, 4);
        switch (dtype) {
        case FI_DTYPE_F32: ((float *)p)[i] = x; break;
        case FI_DTYPE_BF16: ((uint16_t *)p)[i] = (uint16_t)(u >> 16); break;
        case FI_DTYPE_F16: { /* |x| < 1: normal f16 or tiny */
            uint32_t e = (u >> 23) & 0xff;
            uint16_t h = (uint16_t)((u >> 16) & 0x8000);
            if (e > 112) h |= (uint16_t)(((e - 112) << 10) | ((u >> 13) & 0x3ff));
            ((uint16_t *)p)[i] = h;
            break;
        }
        case FI_DTYPE_E4M3: case FI_DTYPE_E5M2: /* a random finite byte pattern */
            ((uint8_t *)p)[i] = (uint8_t)(splitmix(seed) & 0x77);
            break;
        default: break;
        }
    }
}

int bench_batch_make(bench_batch *b, int32_t batch, const int32_t *kv_lens, int32_t qo_len,
                     int32_t page_size, int32_t h_qo, int32_t h_kv, int32_t d,
                     fi_dtype q_dtype, fi_dtype kv_dtype, uint64_t seed) {
    memset(b, 0, sizeof *b);
    b->batch = batch; b->qo_len = qo_len; b->page_size = page_size;
    b->h_qo = h_qo; b->h_kv = h_kv; b->d = d;
    b->q_dtype = q_dtype; b->kv_dtype = kv_dtype; b->o_dtype = q_dtype;
    b->qo_indptr = malloc(sizeof(int32_t) * (batch + 1));
    b->kv_indptr = malloc(sizeof(int32_t) * (batch + 1));
    b->last_page_len = malloc(sizeof(int32_t) * batch);
    b->kv_len = malloc(sizeof(int32_t) * batch);
    if (!b->qo_indptr || !b->kv_indptr || !b->last_page_len || !b->kv_len) return -1;
    b->qo_indptr[0] = b->kv_indptr[0] = 0;
    for (int32_t i = 0; i < batch; i++) {
        int32_t pages = (kv_lens[i] + page_size - 1) / page_size;
        b->kv_len[i] = kv_lens[i];
        b->qo_indptr[i + 1] = b->qo_indptr[i] + qo_len;
        b->kv_indptr[i + 1] = b->kv_indptr[i] + pages;
        b->last_page_len[i] = pages ? kv_lens[i] - (pages - 1) * page_size : 0;
    }
    b->total_qo = b->qo_indptr[batch];
    b->total_pages = b->kv_indptr[batch];
    b->kv_indices = malloc(sizeof(int32_t) * (size_t)(b->total_pages ? b->total_pages : 1));
    if (!b->kv_indices) return -1;
    for (int64_t j = 0; j < b->total_pages; j++) b->kv_indices[j] = (int32_t)j;
    for (int64_t j = b->total_pages - 1; j > 0; j--) { /* shuffle the page table */
        int64_t r = (int64_t)(splitmix(&seed) % (uint64_t)(j + 1));
        int32_t t = b->kv_indices[j];
        b->kv_indices[j] = b->kv_indices[r];
        b->kv_indices[r] = t;
    }
    int64_t kv_elems = b->total_pages * page_size * h_kv * d;
    int64_t q_elems = b->total_qo * h_qo * d;
    b->q = malloc((size_t)q_elems * fi_dtype_size(q_dtype));
    b->o = malloc((size_t)q_elems * fi_dtype_size(q_dtype));
    b->k = malloc((size_t)kv_elems * fi_dtype_size(kv_dtype) + 64);
    b->v = malloc((size_t)kv_elems * fi_dtype_size(kv_dtype) + 64);
    b->lse = malloc(sizeof(float) * (size_t)(b->total_qo * h_qo));
    if (!b->q || !b->o || !b->k || !b->v || !b->lse) return -1;
    fill_random(b->q, q_dtype, q_elems, &seed);
    fill_random(b->k, kv_dtype, kv_elems, &seed);
    fill_random(b->v, kv_dtype, kv_elems, &seed);
    return 0;
}

void bench_batch_free(bench_batch *b) {
    free(b->qo_indptr); free(b->kv_indptr); free(b->kv_indices);
    free(b->last_page_len); free(b->kv_len);
    free(b->q); free(b->k); free(b->v); free(b->o); free(b->lse);
    memset(b, 0, sizeof *b);
}

fi_batch bench_batch_view(const bench_batch *b) {
    fi_batch v = {.batch_size = b->batch, .qo_indptr = b->qo_indptr,
                  .kv_indptr = b->kv_indptr, .kv_indices = b->kv_indices,
                  .kv_last_page_len = b->last_page_len};
    return v;
}

fi_run_args bench_batch_args(const bench_batch *b, int with_lse) {
    fi_run_args a;
    memset(&a, 0, sizeof a);
    int64_t qs[3] = {b->total_qo, b->h_qo, b->d};
    int64_t ks[4] = {b->total_pages, b->page_size, b->h_kv, b->d};
    int64_t ls[2] = {b->total_qo, b->h_qo};
    a.q = fi_tensor_contiguous(b->q, b->q_dtype, 3, qs);
    a.o = fi_tensor_contiguous(b->o, b->o_dtype, 3, qs);
    a.k = fi_tensor_contiguous(b->k, b->kv_dtype, 4, ks);
    a.v = fi_tensor_contiguous(b->v, b->kv_dtype, 4, ks);
    if (with_lse) a.lse = fi_tensor_contiguous(b->lse, FI_DTYPE_F32, 2, ls);
    return a;
}

fi_attention_params bench_batch_params(const bench_batch *b, fi_mask_mode mask) {
    fi_attention_params p;
    fi_attention_params_init(&p);
    p.num_qo_heads = b->h_qo;
    p.num_kv_heads = b->h_kv;
    p.head_dim_qk = p.head_dim_vo = b->d;
    p.page_size = b->page_size;
    p.q_dtype = b->q_dtype;
    p.kv_dtype = b->kv_dtype;
    p.o_dtype = b->o_dtype;
    p.mask_mode = mask;
    return p;
}

fi_plan_config bench_batch_config(const bench_batch *b) {
    fi_plan_config c;
    fi_plan_config_init(&c);
    c.max_batch_size = b->batch;
    c.max_total_qo = (int32_t)b->total_qo;
    c.max_total_kv = (int32_t)b->total_pages;
    return c;
}

double bench_batch_bytes(const bench_batch *b) {
    double kv = 0.0;
    for (int32_t i = 0; i < b->batch; i++) kv += (double)b->kv_len[i];
    double qo = (double)b->total_qo * b->h_qo * b->d;
    return 2.0 * kv * b->h_kv * b->d * (double)fi_dtype_size(b->kv_dtype) +
           qo * (double)(fi_dtype_size(b->q_dtype) + fi_dtype_size(b->o_dtype));
}

double bench_batch_flops(const bench_batch *b, int causal) {
    double pairs = 0.0;
    for (int32_t i = 0; i < b->batch; i++) {
        double lq = b->qo_len, lk = b->kv_len[i];
        if (!causal) { pairs += lq * lk; continue; }
        for (int32_t t = 0; t < b->qo_len; t++) { /* query t sees kv_len - qo_len + t + 1 keys */
            double vis = lk - lq + t + 1;
            pairs += vis < 0 ? 0 : (vis > lk ? lk : vis);
        }
    }
    return 4.0 * b->h_qo * b->d * pairs;
}
