# embkv build.  `make` builds the engine library and the SQLite extension;
# `make test` installs what is missing (Debian packages), builds every
# variant and runs all tests; `make demo` runs the shell walkthrough;
# `make bench` runs the benchmarks.

CC      ?= cc
CSTD    := -std=c11 -D_GNU_SOURCE
WARN    := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wno-unused-parameter
OPT     ?= -O3 -g
CFLAGS  += $(CSTD) $(WARN) $(OPT) -fPIC -pthread -Iext -Iext/engine -Iext/sqlite
LDLIBS  := -lpmemobj -lpmem -luring -lcjson -lz -lm -pthread

B := build
.DEFAULT_GOAL := all

# ext/engine is the store engine (no SQLite inside), ext/sqlite the binding.
ENGINE_SRC := $(wildcard ext/engine/*.c)
SQLEXT_SRC := $(wildcard ext/sqlite/*.c)
HEADERS    := $(wildcard ext/*.h ext/engine/*.h ext/sqlite/*.h)
TEST_SRC   := $(wildcard tests/test_*.c)
# bench_ltm links RocksDB and LMDB: built by `make bench-ltm` only.
BENCH_SRC  := $(filter-out bench/bench_ltm.c,$(wildcard bench/bench_*.c))

# Variants: plain, ASan+UBSan, TSan.  Each has its own object directory.
define variant
$(1)_CFLAGS := $(CFLAGS) $(2)
$(1)_ENGINE_OBJ := $$(patsubst ext/%.c,$(B)/$(1)/ext/%.o,$(ENGINE_SRC))
$(1)_SQLEXT_OBJ := $$(patsubst ext/%.c,$(B)/$(1)/ext/%.o,$(SQLEXT_SRC))
$(1)_TESTS := $$(patsubst tests/%.c,$(B)/$(1)/tests/%,$(TEST_SRC))

$(B)/$(1)/ext/%.o: ext/%.c $(HEADERS) | $(B)/$(1)/ext check-headers
	@mkdir -p $$(dir $$@)
	$$(CC) $$($(1)_CFLAGS) -c $$< -o $$@
$(B)/$(1)/libembkv.a: $$($(1)_ENGINE_OBJ)
	rm -f $$@ && ar rcs $$@ $$^
$(B)/$(1)/tests/%: tests/%.c tests/check.h tests/tier_rows.h $(B)/$(1)/libembkv.a | $(B)/$(1)/tests
	$$(CC) $$($(1)_CFLAGS) -Itests $$< -o $$@ $(B)/$(1)/libembkv.a $(LDLIBS)
$(B)/$(1)/tests/test_model_tier: tests/test_model.c
$(B)/$(1)/tests/test_model_cache: tests/test_model.c
$(B)/$(1)/ext $(B)/$(1)/tests:
	mkdir -p $$@
endef

$(eval $(call variant,plain,))
# (the sanitizer list lives in a variable: a comma inside $(call ...) would split it)
ASAN_FLAGS := -O1 -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
$(eval $(call variant,asan,$(ASAN_FLAGS)))
$(eval $(call variant,tsan,-O1 -fsanitize=thread -DEMBKV_TSAN))

.PHONY: check-headers all deps test test-c test-sql test-python test-crash crash-soak soak plain-tests asan-tests tsan-tests bench bench-ltm demo demo-train clean
all: $(B)/libembkv.a $(B)/embkv.so

$(B)/libembkv.a: $(B)/plain/libembkv.a
	cp $< $@
$(B)/embkv.so: $(plain_SQLEXT_OBJ) $(B)/plain/libembkv.a
	$(CC) -shared -Wl,-z,defs -Wl,-z,nodelete -o $@ $(plain_SQLEXT_OBJ) $(B)/plain/libembkv.a $(LDLIBS)

# The extension built with ASan+UBSan, for the SQL and Python tests (loaded
# with the sanitizer runtimes preloaded: see tests/run.sh).
$(B)/asan/embkv.so: $(asan_SQLEXT_OBJ) $(B)/asan/libembkv.a
	$(CC) -shared -fsanitize=address,undefined -Wl,-z,defs -Wl,-z,nodelete -o $@ $(asan_SQLEXT_OBJ) $(B)/asan/libembkv.a $(LDLIBS)

deps:
	@bash tests/deps.sh

# On a machine without the Debian packages, say so (instead of a compiler's
# "libpmemobj.h: No such file or directory").
check-headers:
	@missing=; for h in libpmemobj.h libpmem.h liburing.h cjson/cJSON.h sqlite3ext.h zlib.h; do \
	    [ -f /usr/include/$$h ] || missing="$$missing $$h"; done; \
	if [ -n "$$missing" ]; then \
	    echo "embkv: missing headers:$$missing; run 'make deps' (installs the Debian packages) first" >&2; exit 1; fi

test: deps
	@$(MAKE) --no-print-directory all plain-tests asan-tests tsan-tests $(B)/asan/embkv.so
	@bash tests/run.sh
	@bash tests/fuzz/run.sh short

# One group of `make test` at a time (each with its sanitizer runs).
test-c: deps
	@$(MAKE) --no-print-directory plain-tests asan-tests tsan-tests
	@bash tests/run.sh c
# The SIGKILL harness alone (tests/crash/), and its long run:
# CRASH_ROUNDS kills (default 10000, about 80 minutes here).
test-crash: deps
	@$(MAKE) --no-print-directory all $(B)/asan/embkv.so
	@bash tests/run.sh crash
# 8 threads of mixed work on one table for SOAK_SECONDS (default 600),
# memory and the store's files sampled (bench/soak.py).
soak: deps all
	@/usr/bin/python3 bench/soak.py /dev/shm/embkv-soak.$$$$ --seconds $(or $(SOAK_SECONDS),600) $(if $(SOAK_SSD_MB),--ssd-mb $(SOAK_SSD_MB))
crash-soak: deps all
	@bash tests/python_run.sh tests/crash/crash_sql.py --rounds $(or $(CRASH_ROUNDS),10000)
test-sql test-python: deps
	@$(MAKE) --no-print-directory all $(B)/asan/embkv.so
	@bash tests/run.sh $(patsubst test-%,%,$@)

plain-tests: $(plain_TESTS) $(B)/pmemsim.so
asan-tests: $(asan_TESTS)
tsan-tests: $(tsan_TESTS)

# Simulated persistent memory for test_powercut (an LD_PRELOAD library).
$(B)/pmemsim.so: tests/powercut/pmemsim.c tests/powercut/filesim.c tests/powercut/pmemsim.h
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -D_GNU_SOURCE -Wall -Wextra -O2 -g -fPIC -shared -o $@ tests/powercut/pmemsim.c tests/powercut/filesim.c -pthread -ldl

$(B)/bench/%: bench/%.c bench/bench_common.h bench/bench_baseline.h $(B)/plain/libembkv.a $(HEADERS) | $(B)/bench
	$(CC) $(CFLAGS) -O3 -march=native -Ibench $< -o $@ $(B)/plain/libembkv.a $(LDLIBS) -lsqlite3
$(B)/bench:
	mkdir -p $@

bench: deps $(patsubst bench/%.c,$(B)/bench/%,$(BENCH_SRC))
	@bash bench/run.sh

# The larger-than-memory benchmark: embkv against RocksDB and LMDB, each run
# in a memory cgroup (needs root).  bench/ltm.sh installs librocksdb-dev and
# liblmdb-dev when missing, then builds $(B)/bench/bench_ltm through this
# rule; LTM_ROWS, LTM_MEM, LTM_BATCHES, LTM_KEEP: see bench/ltm.sh.
$(B)/bench/bench_ltm: bench/bench_ltm.c bench/bench_common.h $(B)/plain/libembkv.a $(HEADERS) | $(B)/bench
	$(CC) $(CFLAGS) -O3 -march=native -Ibench $< -o $@ $(B)/plain/libembkv.a -lrocksdb -llmdb $(LDLIBS)

bench-ltm: deps
	@bash bench/ltm.sh

demo: deps all
	@bash sql/demo.sh

# The CTR model of pysample/train_ctr.py, about a minute on 2 cores; the
# database and the curves go to build/ctr-demo.db(.png).
demo-train: deps all
	@bash pysample/run.sh pysample/train_ctr.py --db $(B)/ctr-demo.db --fresh --workers 2 --staleness 4

clean:
	rm -rf $(B)

include tests/fuzz/fuzz.mk
