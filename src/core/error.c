/* error.c — status names and the thread-local message of the last failure. */
#include "core/internal.h"

#include <stdarg.h>
#include <stdio.h>

/* Large enough for a compiler's log of a variant that did not compile. */
static _Thread_local char last_error[8192];

fi_status fi_error(fi_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return status;
}

void fi_error_clear(void) { last_error[0] = '\0'; }

const char *fi_last_error(void) { return last_error; }

const char *fi_status_string(fi_status status) {
    switch (status) {
    case FI_OK: return "ok";
    case FI_STATUS_INVALID_ARGUMENT: return "invalid argument";
    case FI_STATUS_UNSUPPORTED: return "unsupported";
    case FI_STATUS_OUT_OF_MEMORY: return "out of memory";
    case FI_STATUS_BOUND_EXCEEDED: return "plan bound exceeded";
    case FI_STATUS_NOT_PLANNED: return "not planned";
    case FI_STATUS_NO_DEVICE: return "no device";
    case FI_STATUS_BACKEND_ERROR: return "backend error";
    case FI_STATUS_INTERNAL: return "internal error";
    case FI_STATUS_COMPILE_ERROR: return "compile error";
    }
    return "unknown status";
}
