/*
 * handle.c — recognising live objects: the magic word every handle starts
 * with, and the busy flag that refuses a second thread inside one object.
 *
 * A handle check reads the object's first word. For a destroyed object that
 * read lands in freed memory: best effort (the allocator may have reused
 * it), which the API documents. Under AddressSanitizer the check asks the
 * sanitizer whether the word is still allocated before reading it, so a
 * destroyed handle is refused there without a use-after-free report.
 */
#include "core/internal.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FI_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define FI_ASAN 1
#endif
#ifdef FI_ASAN
#include <sanitizer/asan_interface.h>
#endif

static bool word_readable(const void *p) {
#ifdef FI_ASAN
    return __asan_region_is_poisoned((void *)(uintptr_t)p, sizeof(uint32_t)) == NULL;
#else
    (void)p;
    return true;
#endif
}

fi_status fi_handle_check(const void *obj, uint32_t magic, const char *fn, const char *what) {
    if (!obj) return fi_error(FI_STATUS_INVALID_ARGUMENT, "%s: %s is NULL", fn, what);
    if ((uintptr_t)obj % _Alignof(uint32_t) || !word_readable(obj) ||
        *(const volatile uint32_t *)obj != magic)
        return fi_error(FI_STATUS_INVALID_ARGUMENT,
                        "%s: %s %p is not a live %s (destroyed already, or not made by "
                        "its create function)", fn, what, obj, what);
    return FI_OK;
}

fi_status fi_handle_enter(const void *obj, uint32_t magic, _Atomic int32_t *busy,
                          const char *fn, const char *what) {
    fi_status st = fi_handle_check(obj, magic, fn, what);
    if (st) return st;
    if (atomic_exchange_explicit(busy, 1, memory_order_acquire))
        return fi_error(FI_STATUS_INVALID_ARGUMENT,
                        "%s: %s %p is in use by another call on another thread: an object is "
                        "used by one thread at a time", fn, what, obj);
    return FI_OK;
}

void fi_handle_retire(uint32_t *magic) { *(volatile uint32_t *)magic = FI_MAGIC_DEAD; }
