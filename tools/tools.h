/* tools.h — the subcommands of the `fi` tool, and what they share. */
#ifndef FI_TOOLS_H
#define FI_TOOLS_H

#include "flashinfer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

/* fi demo [--layers N] [--threads N]: returns the process exit code. */
int fi_demo(int argc, char **argv);

/* fi warmup [...]: compile kernels into the cache. */
int fi_warmup(int argc, char **argv);

/* The exit code of a command line the tool cannot use (a bad option or
 * value); 1 is a failure of the work itself. */
enum { FI_EXIT_USAGE = 2 };

/* `text` as a whole number in [lo, hi] into *out: 0, or -1 after a message
 * "fi CMD: OPTION TEXT: expected ..." (no atoi: "abc", "4x", "" and
 * out-of-range values are errors, not 0). */
static inline int fi_tool_number(const char *cmd, const char *option, const char *text, long lo,
                                 long hi, int *out) {
    char *end = NULL;
    errno = 0;
    long v = text ? strtol(text, &end, 10) : 0;
    if (!text || !*text || *end || errno || v < lo || v > hi) {
        fprintf(stderr, "fi %s: %s %s: expected a whole number from %ld to %ld\n", cmd, option,
                text ? text : "(missing)", lo, hi);
        return -1;
    }
    *out = (int)v;
    return 0;
}

#endif
