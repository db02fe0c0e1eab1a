# flashinfer.c — plain make build.
#   make            library (static + shared), the `fi` tool, the tests
#   make demo       build and run `fi demo`
#   make test       build and run every test (make test-quick: the --quick subset)
#   make sanitize   the test suite under AddressSanitizer + UBSan
#   make install    PREFIX=/usr/local
#   make aot        the library with the common CUDA kernels compiled ahead of
#                   time by nvcc (AOT=1; `make gpu` turns it on where nvcc is)
CC      ?= cc
PREFIX  ?= /usr/local
BUILD   ?= build
OPT     ?= -O2
CFLAGS  ?= $(OPT) -g
WARN    := -Wall -Wextra -Wshadow -Wno-unused-parameter
CPPFLAGS_ALL := -Iinclude -Isrc -D_GNU_SOURCE
BASE_CFLAGS  := -std=c11 -fPIC -fvisibility=hidden -pthread $(WARN) $(CFLAGS)
LDLIBS  := -lm -pthread -ldl

ARCH := $(shell uname -m)

# src/backends.c: the registry, the one file that names every backend.
LIB_SRC := src/backends.c $(wildcard src/core/*.c) $(wildcard src/cpu/*.c) $(wildcard src/cuda/*.c)
# SIMD translation units are compiled with their own target flags and only
# called after a run-time CPU check.
ifneq ($(filter x86_64 amd64,$(ARCH)),)
  SIMD_FLAGS_avx512 := -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16 -mfma -mf16c
  SIMD_FLAGS_avx2   := -mavx2 -mfma -mf16c
else
  LIB_SRC := $(filter-out %_avx512.c %_avx2.c,$(LIB_SRC))
endif
ifeq ($(filter aarch64 arm64,$(ARCH)),)
  LIB_SRC := $(filter-out %_neon.c,$(LIB_SRC))
endif

# CUDA kernels (kernels/) are embedded as strings for the NVRTC JIT.
KERNEL_SRC := $(sort $(wildcard kernels/*.cuh kernels/*.h))
KERNEL_GEN := $(BUILD)/gen/kernel_sources.c
# The CPU variant kernel template (src/cpu/variant_kernel.h and what it
# includes) is embedded as text for the CPU JIT (the system C compiler), in
# dependency order; src/cpu/variant_jit.h names the files by this order.
CPU_TEMPLATE_SRC := include/flashinfer.h src/cpu/convert.h src/cpu/variant_abi.h src/cpu/variant_kernel.h
CPU_TEMPLATE_GEN := $(BUILD)/gen/cpu_jit_files.c
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/%.o) $(BUILD)/gen/kernel_sources.o $(BUILD)/gen/cpu_jit_files.o \
           $(BUILD)/gen/aot_table.o

# Kernels compiled ahead of time (src/cuda/aot_set.c) into a table of sm_90a
# cubins in the library, found before the disk cache and NVRTC. AOT=1 needs
# nvcc; `make aot` and `make gpu` set it where nvcc exists; plain `make`
# builds an empty table (JIT only). The flag file makes a change of AOT
# rebuild the table.
NVCC ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
ifneq ($(filter aot gpu,$(MAKECMDGOALS)),)
  AOT ?= $(if $(NVCC),1,0)
endif
AOT ?= 0
AOT_FLAG := $(BUILD)/gen/aot.flag
$(shell mkdir -p $(BUILD)/gen && { [ "$$(cat $(AOT_FLAG) 2>/dev/null)" = "$(AOT)" ] || echo "$(AOT)" > $(AOT_FLAG); })
STATIC  := $(BUILD)/libflashinfer.a
SHARED  := $(BUILD)/libflashinfer.so

TEST_SUPPORT_SRC := $(filter-out tests/test_%.c,$(wildcard tests/*.c))
TEST_SUPPORT_OBJ := $(TEST_SUPPORT_SRC:%.c=$(BUILD)/%.o)
TEST_SRC  := $(wildcard tests/test_*.c)
TEST_BIN  := $(TEST_SRC:tests/%.c=$(BUILD)/%)
TOOL_SRC  := $(wildcard tools/*.c)
TOOL_BIN  := $(BUILD)/fi
BENCH_SRC := $(wildcard bench/bench_*.c)
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/%)
EXAMPLE_SRC := $(wildcard examples/*.c)
EXAMPLE_BIN := $(EXAMPLE_SRC:examples/%.c=$(BUILD)/example_%)
GPU_SRC   := $(wildcard tests/gpu/*.c)
GPU_BIN   := $(GPU_SRC:tests/gpu/%.c=$(BUILD)/%)
CUDA_BENCH_SRC := $(wildcard bench/cuda/bench_*.c)
CUDA_BENCH_BIN := $(CUDA_BENCH_SRC:bench/cuda/%.c=$(BUILD)/%)

.PHONY: all lib test test-quick demo sanitize tsan fuzz install clean bench gpu aot stub
all: lib $(TOOL_BIN) $(TEST_BIN) $(BENCH_BIN) $(GPU_BIN) $(CUDA_BENCH_BIN) $(EXAMPLE_BIN)
lib: $(STATIC) $(SHARED)

# The objects of programs (tests/test_*.o, bench/, examples/) are made by
# pattern rules alone, which makes them intermediate files that make deletes
# after linking; every target is kept instead, so a second build compiles
# nothing.
.SECONDARY:

# make test and make demo build in parallel, one job per core, unless make
# was given -j itself (a -j in a sub-make would reset the jobserver).
NPROC := $(shell nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)
PARALLEL = $(if $(filter -j%,$(MAKEFLAGS)),,-j$(NPROC))

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS_ALL) $(BASE_CFLAGS) $(SIMD_FLAGS_$(lastword $(subst _, ,$(basename $(notdir $<))))) -MMD -MP -c $< -o $@

$(KERNEL_GEN): $(KERNEL_SRC) src/embed.sh
	@mkdir -p $(dir $@)
	sh src/embed.sh --sizes cuda/kernel_sources.h fi_kernel_file fi_kernel_files \
	    fi_kernel_file_count $(KERNEL_SRC) > $@.tmp && mv $@.tmp $@

$(BUILD)/gen/kernel_sources.o: $(KERNEL_GEN)
	$(CC) $(CPPFLAGS_ALL) $(BASE_CFLAGS) -c $< -o $@

$(CPU_TEMPLATE_GEN): $(CPU_TEMPLATE_SRC) src/embed.sh
	@mkdir -p $(dir $@)
	sh src/embed.sh --flatten cpu/variant_jit.h fi_cpu_jit_file fi_cpu_jit_files \
	    fi_cpu_jit_file_count $(CPU_TEMPLATE_SRC) > $@.tmp && mv $@.tmp $@

$(BUILD)/gen/cpu_jit_files.o: $(CPU_TEMPLATE_GEN)
	$(CC) $(CPPFLAGS_ALL) $(BASE_CFLAGS) -c $< -o $@

# The list tool links the library's objects with an empty table (the real
# one is what it helps build).
$(BUILD)/gen/aot_empty.c: src/cuda/aot/table.sh
	@mkdir -p $(dir $@)
	sh src/cuda/aot/table.sh $(BUILD) < /dev/null > $@

$(BUILD)/gen/aot_empty.o: $(BUILD)/gen/aot_empty.c
	$(CC) $(CPPFLAGS_ALL) $(BASE_CFLAGS) -c $< -o $@

$(BUILD)/aot_list: src/cuda/aot/list.c $(filter-out $(BUILD)/gen/aot_table.o,$(LIB_OBJ)) \
                   $(BUILD)/gen/aot_empty.o
	$(CC) $(CPPFLAGS_ALL) $(BASE_CFLAGS) -o $@ $^ $(LDLIBS)

ifeq ($(AOT),1)
$(BUILD)/gen/aot_table.c: $(AOT_FLAG) $(KERNEL_SRC) $(BUILD)/aot_list $(wildcard src/cuda/aot/*.sh)
	@test -n "$(NVCC)" || { echo "AOT=1 needs nvcc (not found; NVCC=path)"; exit 1; }
	sh src/cuda/aot/build.sh $(NVCC) $(BUILD)
else
$(BUILD)/gen/aot_table.c: $(AOT_FLAG) $(BUILD)/gen/aot_empty.c
	cp $(BUILD)/gen/aot_empty.c $@
endif

$(BUILD)/gen/aot_table.o: $(BUILD)/gen/aot_table.c
	$(CC) $(CPPFLAGS_ALL) $(BASE_CFLAGS) -c $< -o $@

$(STATIC): $(LIB_OBJ)
	@rm -f $@
	$(AR) rcs $@ $^

$(SHARED): $(LIB_OBJ)
	$(CC) -shared -o $@ $^ $(LDLIBS) -Wl,-soname,libflashinfer.so.0

$(BUILD)/test_%: $(BUILD)/tests/test_%.o $(TEST_SUPPORT_OBJ) $(STATIC)
	$(CC) $(BASE_CFLAGS) -o $@ $^ $(LDLIBS)

# test_warmup runs `fi warmup` in-process.
$(BUILD)/test_warmup: $(BUILD)/tests/test_warmup.o $(BUILD)/tools/warmup.o $(TEST_SUPPORT_OBJ) $(STATIC)
	$(CC) $(BASE_CFLAGS) -o $@ $^ $(LDLIBS)

# The installed tool: the public API alone (tools/ includes flashinfer.h only).
$(TOOL_BIN): $(TOOL_SRC:%.c=$(BUILD)/%.o) $(STATIC)
	$(CC) $(BASE_CFLAGS) -o $@ $^ $(LDLIBS)

# examples/: programs of the public API alone (the README's and VARIANTS.md's).
$(BUILD)/example_%: $(BUILD)/examples/%.o $(STATIC)
	$(CC) $(BASE_CFLAGS) -o $@ $^ $(LDLIBS)

BENCH_SUPPORT_OBJ := $(BUILD)/bench/common.o
$(BUILD)/bench_%: $(BUILD)/bench/bench_%.o $(BENCH_SUPPORT_OBJ) $(TEST_SUPPORT_OBJ) $(STATIC)
	$(CC) $(BASE_CFLAGS) -o $@ $^ $(LDLIBS)

# CUDA programs, the tests (tests/gpu) and the benchmarks (bench/cuda): built
# everywhere (no CUDA headers needed); they run on the device machine
# (tests/gpu/run_device.sh).
$(GPU_BIN): $(BUILD)/%: $(BUILD)/tests/gpu/%.o $(TEST_SUPPORT_OBJ) $(STATIC)
	$(CC) $(BASE_CFLAGS) -o $@ $^ $(LDLIBS)
$(CUDA_BENCH_BIN): $(BUILD)/%: $(BUILD)/bench/cuda/%.o $(TEST_SUPPORT_OBJ) $(STATIC)
	$(CC) $(BASE_CFLAGS) -o $@ $^ $(LDLIBS)
gpu: $(GPU_BIN) $(CUDA_BENCH_BIN)
# The access pattern's ceiling (loads only, no attention): a CUDA runtime
# program, so nvcc builds it (run_device.sh on the GPU, ci_compile.sh in CI).
$(BUILD)/bench_gather: bench/cuda/bench_gather.cu
	@test -n "$(NVCC)" || { echo "bench_gather needs nvcc (not found; NVCC=path)"; exit 1; }
	@mkdir -p $(dir $@)
	$(NVCC) -O3 -std=c++17 -arch=sm_90a -o $@ $<
aot: lib
	@[ "$(AOT)" = 1 ] || echo "make aot: no nvcc found (NVCC=path): the library has no AOT table"

# A stand-in driver (no GPU): profile the CUDA backend's host path here.
$(BUILD)/stub/libcuda.so.1: tests/gpu/stub/libcuda.c
	@mkdir -p $(dir $@)
	$(CC) $(BASE_CFLAGS) -fvisibility=default -finstrument-functions -shared -o $@ $<
stub: $(BUILD)/stub/libcuda.so.1

# The demo: a CPU serving step, checked against its own fp64 reference.
demo:
	@$(MAKE) --no-print-directory $(PARALLEL) $(TOOL_BIN)
	$(TOOL_BIN) demo

# Every test: the programs built in parallel, then run one after another by
# tests/run.sh (a line per program with its counts and time, the output of
# a failing one, the reasons for skips, and "total: N passed, N failed, N
# skipped" last); each output in $(BUILD)/test-logs/. tests/test_cli.sh
# checks the `fi` tool. FI_TEST_ARGS passes options to every program
# (tests/README.md), FI_TEST_VERBOSE=1 shows every output.
test:
	@$(MAKE) --no-print-directory $(PARALLEL) $(TEST_BIN) $(TOOL_BIN)
	@FI=$(TOOL_BIN) sh tests/run.sh $(BUILD)/test-logs $(TEST_BIN) tests/test_cli.sh

# The representative subset of every test program (some 20 s on 2 cores).
test-quick:
	@$(MAKE) --no-print-directory test FI_TEST_ARGS="--quick"

sanitize:
	$(MAKE) BUILD=build-san OPT=-O1 \
	  CFLAGS="-O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" \
	  LDLIBS="-lm -pthread -ldl -fsanitize=address,undefined" \
	  FI_TEST_ARGS="--quick" test

# The concurrency tests under ThreadSanitizer: tests/test_threads.c (separate
# contexts, one shared CPU context, one plan refused to a second thread) and
# the per-thread messages of test_bad_input. A reported race fails it.
TSAN_BUILD ?= build-tsan
tsan:
	@$(MAKE) --no-print-directory BUILD=$(TSAN_BUILD) OPT=-O1 CFLAGS="-O1 -g -fsanitize=thread" \
	  LDLIBS="-lm -pthread -ldl -fsanitize=thread" $(TSAN_BUILD)/test_threads $(TSAN_BUILD)/test_bad_input
	TSAN_OPTIONS=halt_on_error=1 $(TSAN_BUILD)/test_threads $(FI_TEST_ARGS)
	TSAN_OPTIONS=halt_on_error=1 $(TSAN_BUILD)/test_bad_input --filter lifecycle/last_error_per_thread

# Fuzzing (tests/README.md, "Fuzzing"): the libFuzzer targets of tests/fuzz/,
# built by clang with ASan + UBSan, each run for FUZZ_SECONDS from its seed
# corpus tests/fuzz/corpus/<target> (what it finds new goes to
# $(FUZZ_BUILD)/corpus/<target>); FUZZ_TARGETS picks some. A finding stops
# it, with the input saved as $(FUZZ_BUILD)/<target>-crash-*.
FUZZ_SECONDS ?= 20
FUZZ_BUILD ?= build-fuzz
FUZZ_SRC := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_TARGETS ?= $(FUZZ_SRC:tests/fuzz/%.c=%)
FUZZ_CFLAGS := -O1 -g -fsanitize=address,undefined,fuzzer-no-link -fno-sanitize-recover=undefined \
               -fno-omit-frame-pointer
FUZZ_RUN := -max_len=4096 -rss_limit_mb=2048 -malloc_limit_mb=1048576 -timeout=60 -print_final_stats=1
$(FUZZ_SRC:tests/fuzz/%.c=$(BUILD)/%): $(BUILD)/%: $(BUILD)/tests/fuzz/%.o $(BUILD)/tests/fuzz/fuzz.o \
                                       $(TEST_SUPPORT_OBJ) $(STATIC)
	$(CC) $(BASE_CFLAGS) -fsanitize=fuzzer -o $@ $^ $(LDLIBS)
fuzz:
	@$(MAKE) --no-print-directory BUILD=$(FUZZ_BUILD) CC=clang OPT=-O1 CFLAGS="$(FUZZ_CFLAGS)" \
	  LDLIBS="-lm -pthread -ldl -fsanitize=address,undefined" $(FUZZ_TARGETS:%=$(FUZZ_BUILD)/%)
	@set -e; for t in $(FUZZ_TARGETS); do \
	  mkdir -p $(FUZZ_BUILD)/corpus/$$t; \
	  echo "== $$t: $(FUZZ_SECONDS) s"; \
	  if ! ASAN_OPTIONS=allocator_may_return_null=1:max_allocation_size_mb=256 $(FUZZ_BUILD)/$$t $(FUZZ_RUN) \
	      -max_total_time=$(FUZZ_SECONDS) -artifact_prefix=$(FUZZ_BUILD)/$$t- \
	      $(FUZZ_BUILD)/corpus/$$t tests/fuzz/corpus/$$t > $(FUZZ_BUILD)/$$t.log 2>&1; then \
	    tail -40 $(FUZZ_BUILD)/$$t.log; \
	    echo "FAIL $$t: $(FUZZ_BUILD)/$$t.log; rerun the input: $(FUZZ_BUILD)/$$t <file>"; exit 1; \
	  fi; \
	  grep -hE "^stat::(number_of_executed_units|new_units_added|peak_rss_mb)" $(FUZZ_BUILD)/$$t.log | \
	    tr '\n' ' '; echo; \
	done

bench: $(BENCH_BIN) $(CUDA_BENCH_BIN)

install: lib $(TOOL_BIN)
	install -d $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/bin
	install -m 644 include/flashinfer.h $(DESTDIR)$(PREFIX)/include/
	install -m 644 $(STATIC) $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(SHARED) $(DESTDIR)$(PREFIX)/lib/libflashinfer.so.0
	ln -sf libflashinfer.so.0 $(DESTDIR)$(PREFIX)/lib/libflashinfer.so
	install -m 755 $(TOOL_BIN) $(DESTDIR)$(PREFIX)/bin/fi
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(shell sed -n 's/^#define FI_VERSION_STRING "\(.*\)"/\1/p' include/flashinfer.h)|' \
	  flashinfer.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/flashinfer.pc

clean:
	rm -rf build build-san build-tsan build-fuzz

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
