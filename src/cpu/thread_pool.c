/*
 * thread_pool.c — persistent worker threads for the CPU backend.
 *
 * A run publishes (fn, arg) and bumps a generation counter; workers spin on
 * the counter for a short while after each job (back-to-back layers then
 * start without a wake-up) and sleep on a condition variable when idle
 * longer. The caller is worker 0 and waits for the others by spinning,
 * then sleeping. Nothing is allocated per run.
 */
#include "cpu/cpu.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield")
#else
#define cpu_relax() ((void)0)
#endif

/* Spin iterations (~pause instructions) before sleeping. */
#define SPIN_ITERS 20000

typedef struct worker {
    struct fi_thread_pool *pool;
    int32_t index;
    pthread_t thread;
} worker;

struct fi_thread_pool {
    int32_t n;                 /* workers, including the caller */
    worker *workers;           /* [n]; entry 0 unused (the caller) */
    int32_t started;           /* threads actually created */
    pthread_mutex_t run_lock;  /* one run at a time per pool */

    fi_pool_fn fn;             /* the job, published before generation */
    void *arg;
    _Atomic uint64_t generation;
    _Atomic int32_t pending;   /* workers (other than 0) still running the job */
    _Atomic int stop;

    pthread_mutex_t mu;        /* guards sleeping/waking below */
    pthread_cond_t wake;       /* workers wait here for a new generation */
    pthread_cond_t done;       /* the caller waits here for pending == 0 */
    int32_t sleepers;
    int32_t caller_waiting;
};

static void *worker_main(void *p) {
    worker *w = p;
    fi_thread_pool *pool = w->pool;
    uint64_t seen = 0;
    for (;;) {
        uint64_t g = atomic_load_explicit(&pool->generation, memory_order_acquire);
        for (int i = 0; g == seen && i < SPIN_ITERS; i++) {
            cpu_relax();
            g = atomic_load_explicit(&pool->generation, memory_order_acquire);
        }
        if (g == seen) {
            pthread_mutex_lock(&pool->mu);
            pool->sleepers++;
            while ((g = atomic_load(&pool->generation)) == seen && !atomic_load(&pool->stop))
                pthread_cond_wait(&pool->wake, &pool->mu);
            pool->sleepers--;
            pthread_mutex_unlock(&pool->mu);
        }
        if (atomic_load(&pool->stop)) return NULL;
        seen = g;
        pool->fn(pool->arg, w->index, pool->n);
        if (atomic_fetch_sub_explicit(&pool->pending, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&pool->mu);
            if (pool->caller_waiting) pthread_cond_signal(&pool->done);
            pthread_mutex_unlock(&pool->mu);
        }
    }
}

static void stop_workers(fi_thread_pool *pool) {
    pthread_mutex_lock(&pool->mu);
    atomic_store(&pool->stop, 1);
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mu);
    for (int32_t i = 1; i <= pool->started; i++) pthread_join(pool->workers[i].thread, NULL);
}

fi_status fi_thread_pool_create(int32_t num_threads, fi_thread_pool **out) {
    *out = NULL;
    if (num_threads < 1) num_threads = 1;
    fi_thread_pool *pool = calloc(1, sizeof *pool);
    worker *ws = calloc((size_t)num_threads, sizeof *ws);
    if (!pool || !ws) {
        free(pool);
        free(ws);
        return fi_error(FI_STATUS_OUT_OF_MEMORY, "thread pool: out of memory");
    }
    pool->n = num_threads;
    pool->workers = ws;
    pthread_mutex_init(&pool->run_lock, NULL);
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->wake, NULL);
    pthread_cond_init(&pool->done, NULL);
    for (int32_t i = 1; i < num_threads; i++) {
        ws[i].pool = pool;
        ws[i].index = i;
        if (pthread_create(&ws[i].thread, NULL, worker_main, &ws[i]) != 0) {
            fi_thread_pool_destroy(pool);
            return fi_error(FI_STATUS_BACKEND_ERROR,
                            "thread pool: could not start thread %d of %d", (int)i,
                            (int)num_threads);
        }
        pool->started = i;
    }
    *out = pool;
    return FI_OK;
}

void fi_thread_pool_destroy(fi_thread_pool *pool) {
    if (!pool) return;
    stop_workers(pool);
    pthread_cond_destroy(&pool->done);
    pthread_cond_destroy(&pool->wake);
    pthread_mutex_destroy(&pool->mu);
    pthread_mutex_destroy(&pool->run_lock);
    free(pool->workers);
    free(pool);
}

int32_t fi_thread_pool_size(const fi_thread_pool *pool) { return pool ? pool->n : 1; }

static void wait_pending(fi_thread_pool *pool) {
    for (int i = 0; i < SPIN_ITERS; i++) {
        if (atomic_load_explicit(&pool->pending, memory_order_acquire) == 0) return;
        cpu_relax();
    }
    pthread_mutex_lock(&pool->mu);
    pool->caller_waiting = 1;
    while (atomic_load_explicit(&pool->pending, memory_order_acquire) != 0)
        pthread_cond_wait(&pool->done, &pool->mu);
    pool->caller_waiting = 0;
    pthread_mutex_unlock(&pool->mu);
}

/* Runs are serialised per pool (also with one thread): they share the
 * per-thread scratch of the context. */
void fi_thread_pool_run(fi_thread_pool *pool, fi_pool_fn fn, void *arg) {
    pthread_mutex_lock(&pool->run_lock);
    if (pool->n == 1) {
        fn(arg, 0, 1);
        pthread_mutex_unlock(&pool->run_lock);
        return;
    }
    pool->fn = fn;
    pool->arg = arg;
    atomic_store_explicit(&pool->pending, pool->n - 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&pool->generation, 1, memory_order_release);
    pthread_mutex_lock(&pool->mu);
    if (pool->sleepers) pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mu);
    fn(arg, 0, pool->n);
    wait_pending(pool);
    pthread_mutex_unlock(&pool->run_lock);
}
