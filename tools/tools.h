/* tools.h — the subcommands of the `fi` tool. */
#ifndef FI_TOOLS_H
#define FI_TOOLS_H

#include "flashinfer.h"

/* fi demo [--layers N] [--threads N]: returns the process exit code. */
int fi_demo(int argc, char **argv);

/* fi warmup [...]: compile variant kernels into the cache. */
int fi_warmup(int argc, char **argv);

#endif
