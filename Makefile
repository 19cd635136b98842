# embkv build.  `make` builds the engine library and the SQLite extension;
# `make test` installs what is missing (Debian packages), builds every
# variant and runs all tests; `make demo` runs the shell walkthrough;
# `make bench` runs the benchmarks.  `make install` (PREFIX, DESTDIR,
# LIBDIR, INCLUDEDIR, EXTDIR) installs the header, the libraries, the
# extension and embkv.pc; `make venv` installs the Python package into
# build/venv (docs/install.md).

CC      ?= cc
CSTD    := -std=c11 -D_GNU_SOURCE
WARN    := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wno-unused-parameter
OPT     ?= -O3 -g
CFLAGS  += $(CSTD) $(WARN) $(OPT) -fPIC -pthread -Iext -Iext/engine -Iext/sqlite
LDLIBS  := -lpmemobj -lpmem -luring -lcjson -lz -lm -pthread

B := build
.DEFAULT_GOAL := all

# The CUDA part (docs/gpu.md): built when nvcc is found (on PATH or in
# /usr/local/cuda/bin); `make CUDA=0` leaves it out.  Nothing of CUDA is
# linked: the kernels are embedded as a fat binary and the driver is
# loaded at first use (ext/engine/gpudrv.c).  After changing CUDA, `make
# clean` first (objects do not record the flags they were built with).
NVCC ?= $(shell command -v nvcc 2>/dev/null || { test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc; })
CUDA ?= $(if $(NVCC),1,0)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
# Code for the A100 (sm_80), H100/H200 (sm_90), and PTX the driver compiles for newer GPUs.
NVCC_ARCH ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
             -gencode arch=compute_90,code=compute_90
ifeq ($(CUDA),1)
ifeq ($(NVCC),)
$(error CUDA=1 but no nvcc: install the CUDA toolkit, or build with CUDA=0)
endif
CFLAGS += -DEMBKV_WITH_CUDA -I$(B)/gen -I$(CUDA_HOME)/include
GEN_HEADERS := $(B)/gen/gpu_fatbin.h
# A stand-in libcuda.so.1 (tests/gpu/fakecuda.c) and the GPU test linked
# for it, built with the plain tests: the driver path runs here too
# (tests/run.sh).
FAKECUDA := $(B)/fakecuda/libcuda.so.1 $(B)/fakecuda/test_gpu_real
endif

# The release: EMBKV_VERSION_STRING of ext/embkv.h, the one place it is written.
VERSION := $(shell sed -n 's/^.define EMBKV_VERSION_STRING "\([^"]*\)".*/\1/p' ext/embkv.h)
# The shared library's ABI number (its soname is libembkv.so.$(SOVERSION)).
SOVERSION := 0

# Where `make install` puts things (DESTDIR is prepended to each).
PREFIX       ?= /usr/local
LIBDIR       ?= $(PREFIX)/lib
INCLUDEDIR   ?= $(PREFIX)/include
EXTDIR       ?= $(LIBDIR)/sqlite3
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
INSTALL      ?= install
# A path as a .pc file holds it: spaces escaped, as pkg-config reads them.
empty :=
space := $(empty) $(empty)
pc_path = $(subst $(space),\$(space),$(1))
# Run after a real install (no DESTDIR) as root; empty: not run.
LDCONFIG     ?= ldconfig
# The Python the package is installed for (its sqlite3 must load extensions;
# Debian's can).  Another: make PYTHON=... venv
PYTHON       := /usr/bin/python3
VENV         := $(B)/venv

# ext/engine is the store engine (no SQLite inside), ext/sqlite the binding.
ENGINE_SRC := $(wildcard ext/engine/*.c)
SQLEXT_SRC := $(wildcard ext/sqlite/*.c)
HEADERS    := $(wildcard ext/*.h ext/engine/*.h ext/sqlite/*.h)
TEST_SRC   := $(wildcard tests/test_*.c)
# bench_ltm links RocksDB and LMDB: built by `make bench-ltm` only.
BENCH_SRC  := $(filter-out bench/bench_ltm.c,$(wildcard bench/bench_*.c))

# Flags of one file: knn.c's distances may use fused multiply-adds
# (its top comment says why that is fine there and nowhere else).
FILE_CFLAGS_engine/knn := -ffp-contract=fast
# train.c's optimizer loops take square roots of sums that are never
# negative: without errno to set, sqrt is one vector instruction and the
# loops vectorize (train.c's OPTIMIZER_STEPS says what that buys).
FILE_CFLAGS_engine/train := -fno-math-errno

# Variants: plain, ASan+UBSan, TSan.  Each has its own object directory.
define variant
$(1)_CFLAGS := $(CFLAGS) $(2)
$(1)_ENGINE_OBJ := $$(patsubst ext/%.c,$(B)/$(1)/ext/%.o,$(ENGINE_SRC))
$(1)_SQLEXT_OBJ := $$(patsubst ext/%.c,$(B)/$(1)/ext/%.o,$(SQLEXT_SRC))
$(1)_TESTS := $$(patsubst tests/%.c,$(B)/$(1)/tests/%,$(TEST_SRC))

$(B)/$(1)/ext/%.o: ext/%.c $(HEADERS) $(GEN_HEADERS) | $(B)/$(1)/ext check-headers
	@mkdir -p $$(dir $$@)
	$$(CC) $$($(1)_CFLAGS) $$(FILE_CFLAGS_$$*) -c $$< -o $$@
$(B)/$(1)/libembkv.a: $$($(1)_ENGINE_OBJ)
	rm -f $$@ && ar rcs $$@ $$^
$(B)/$(1)/tests/%: tests/%.c tests/check.h tests/tier_rows.h tests/knn_rows.h $(B)/$(1)/libembkv.a | $(B)/$(1)/tests
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


.PHONY: gpu-bundle
.PHONY: check-headers layers-objects check-layers all install uninstall venv deps test test-c test-sql test-python test-crash crash-soak soak plain-tests asan-tests tsan-tests bench bench-ltm demo demo-train demo-kg clean
all: $(B)/libembkv.a $(B)/libembkv.so $(B)/embkv.so

# The kernels as a fat binary, then as a C array for gpudrv.c (od: no
# tool beyond coreutils).  -Werror: the CUDA part compiles with no warnings.
$(B)/gen/gpu_kernels.fatbin: ext/engine/gpu_kernels.cu
	@mkdir -p $(dir $@)
	$(NVCC) -fatbin -O3 -Werror all-warnings -Xptxas -Werror $(NVCC_ARCH) -o $@ $<
$(B)/gen/gpu_fatbin.h: $(B)/gen/gpu_kernels.fatbin
	{ echo '/* generated from ext/engine/gpu_kernels.cu by the Makefile */'; \
	  echo 'static const unsigned char embkv_gpu_fatbin[] __attribute__((aligned(8))) = {'; \
	  od -An -v -tx1 $< | sed -e 's/ \([0-9a-f][0-9a-f]\)/0x\1,/g'; echo '};'; } > $@.tmp && mv $@.tmp $@

$(B)/libembkv.a: $(B)/plain/libembkv.a
	cp $< $@
# The engine as a shared library (installed as libembkv.so.$(VERSION)).
$(B)/libembkv.so: $(plain_ENGINE_OBJ) ext/libembkv.map
	$(CC) -shared -Wl,-soname,libembkv.so.$(SOVERSION) -Wl,-z,defs -Wl,--version-script=ext/libembkv.map \
	    -o $@ $(plain_ENGINE_OBJ) $(LDLIBS)
$(B)/embkv.so: $(plain_SQLEXT_OBJ) $(B)/plain/libembkv.a ext/sqlite/embkv.map
	$(CC) -shared -Wl,-z,defs -Wl,-z,nodelete -Wl,--version-script=ext/sqlite/embkv.map \
	    -o $@ $(plain_SQLEXT_OBJ) $(B)/plain/libembkv.a $(LDLIBS)

# The extension built with ASan+UBSan, for the SQL and Python tests (loaded
# with the sanitizer runtimes preloaded: see tests/run.sh).
$(B)/asan/embkv.so: $(asan_SQLEXT_OBJ) $(B)/asan/libembkv.a ext/sqlite/embkv.map
	$(CC) -shared -fsanitize=address,undefined -Wl,-z,defs -Wl,-z,nodelete -Wl,--version-script=ext/sqlite/embkv.map \
	    -o $@ $(asan_SQLEXT_OBJ) $(B)/asan/libembkv.a $(LDLIBS)

deps:
	@bash tests/deps.sh

# C users: $(INCLUDEDIR)/embkv.h (the public API), $(LIBDIR)/libembkv.a and
# libembkv.so, $(PKGCONFIGDIR)/embkv.pc; the SQLite extension as
# $(EXTDIR)/embkv.so (`.load $(EXTDIR)/embkv` in the sqlite3 shell).
# The paths reach the shell through the environment, never its parser: a
# quote, a backslash, # or ` in one is refused before anything is made
# (the shell would break on it, and pkg-config would cut the path there).
install uninstall: export EMBKV_INSTALL_PATHS = $(PREFIX)|$(LIBDIR)|$(INCLUDEDIR)|$(EXTDIR)|$(PKGCONFIGDIR)|$(DESTDIR)
CHECK_INSTALL_PATHS = @case "$$EMBKV_INSTALL_PATHS" in *[\"\'\`\#]* | *\\*) \
	echo "embkv: PREFIX, LIBDIR, INCLUDEDIR, EXTDIR, PKGCONFIGDIR and DESTDIR may not hold a quote, a backslash, \# or \`" \
	     "(here: $$EMBKV_INSTALL_PATHS): choose another directory, or make a link to it" >&2; exit 1;; esac
install: all
	$(CHECK_INSTALL_PATHS)
	@test -n "$(VERSION)" || { echo "embkv: no EMBKV_VERSION_STRING in ext/embkv.h" >&2; exit 1; }
	@for v in 'PREFIX=$(PREFIX)' 'LIBDIR=$(LIBDIR)' 'INCLUDEDIR=$(INCLUDEDIR)' 'EXTDIR=$(EXTDIR)' \
	          'PKGCONFIGDIR=$(PKGCONFIGDIR)'; do case "$${v#*=}" in /*) ;; *) \
	    echo "embkv: $${v%%=*} must be an absolute path, not '$${v#*=}' (the pkg-config file and the programs" \
	         "linked with the library name it as given)" >&2; exit 1;; esac; done
	$(INSTALL) -d "$(DESTDIR)$(INCLUDEDIR)" "$(DESTDIR)$(LIBDIR)" "$(DESTDIR)$(EXTDIR)" "$(DESTDIR)$(PKGCONFIGDIR)"
	$(INSTALL) -m 644 ext/embkv.h "$(DESTDIR)$(INCLUDEDIR)/embkv.h"
	$(INSTALL) -m 644 $(B)/libembkv.a "$(DESTDIR)$(LIBDIR)/libembkv.a"
	$(INSTALL) -m 755 $(B)/libembkv.so "$(DESTDIR)$(LIBDIR)/libembkv.so.$(VERSION)"
	ln -sf libembkv.so.$(VERSION) "$(DESTDIR)$(LIBDIR)/libembkv.so.$(SOVERSION)"
	ln -sf libembkv.so.$(SOVERSION) "$(DESTDIR)$(LIBDIR)/libembkv.so"
	$(INSTALL) -m 755 $(B)/embkv.so "$(DESTDIR)$(EXTDIR)/embkv.so"
	printf '%s\n' 'prefix=$(call pc_path,$(PREFIX))' 'libdir=$(call pc_path,$(LIBDIR))' \
	    'includedir=$(call pc_path,$(INCLUDEDIR))' \
	    '# the SQLite extension (load_extension takes the path with or without .so)' \
	    'extension=$(call pc_path,$(EXTDIR))/embkv.so' '' \
	    'Name: embkv' \
	    'Description: embkv storage engine for ML embedding tables (C API; SQLite extension at $${extension})' \
	    'Version: $(VERSION)' \
	    'Requires.private: libpmemobj libpmem liburing libcjson zlib' \
	    'Libs: -L$${libdir} -lembkv' \
	    'Libs.private: -lm -pthread' \
	    'Cflags: -I$${includedir}' > "$(DESTDIR)$(PKGCONFIGDIR)/embkv.pc"
	chmod 644 "$(DESTDIR)$(PKGCONFIGDIR)/embkv.pc"
	@# the dynamic linker's cache, for a real install as root
	$(if $(LDCONFIG),@if [ -z "$(DESTDIR)" ] && [ "$$(id -u)" = 0 ]; then echo $(LDCONFIG); $(LDCONFIG); fi)

uninstall:
	$(CHECK_INSTALL_PATHS)
	rm -f "$(DESTDIR)$(INCLUDEDIR)/embkv.h" "$(DESTDIR)$(LIBDIR)/libembkv.a" \
	    "$(DESTDIR)$(LIBDIR)/libembkv.so" "$(DESTDIR)$(LIBDIR)/libembkv.so.$(SOVERSION)" \
	    "$(DESTDIR)$(LIBDIR)/libembkv.so.$(VERSION)" "$(DESTDIR)$(EXTDIR)/embkv.so" \
	    "$(DESTDIR)$(PKGCONFIGDIR)/embkv.pc"
	@rmdir "$(DESTDIR)$(EXTDIR)" 2>/dev/null || true

# The Python package installed (with pip, no network) into a virtual
# environment that sees Debian's numpy and torch: the Python tests, the
# samples and the benchmarks run with $(VENV)/bin/python.  Installed again
# when the extension or the package's files change.
venv: $(VENV)/.installed
$(VENV)/.installed: $(B)/embkv.so ext/embkv.h setup.py $(wildcard pysample/embkv/*.py)
	@test -x $(VENV)/bin/python || $(PYTHON) -m venv --system-site-packages $(VENV) || { \
	    echo "embkv: could not create $(VENV) with $(PYTHON) -m venv (Debian: apt-get install python3-venv, or make deps)" >&2; \
	    rm -rf $(VENV); exit 1; }
	@$(VENV)/bin/python -c 'import sqlite3; sqlite3.connect(":memory:").enable_load_extension(True)' 2>/dev/null || { \
	    echo "embkv: the sqlite3 module of $(PYTHON) cannot load extensions: make PYTHON=/usr/bin/python3 (Debian's) venv" >&2; \
	    rm -rf $(VENV); exit 1; }
	$(VENV)/bin/python -m pip install --quiet --no-index --no-cache-dir --disable-pip-version-check .
	@touch $@

# On a machine without the Debian packages, say so (instead of a compiler's
# "libpmemobj.h: No such file or directory").
check-headers:
	@missing=; for h in libpmemobj.h libpmem.h liburing.h cjson/cJSON.h sqlite3ext.h zlib.h; do \
	    [ -f /usr/include/$$h ] || missing="$$missing $$h"; done; \
	if [ -n "$$missing" ]; then \
	    echo "embkv: missing headers:$$missing; run 'make deps' (installs the Debian packages) first" >&2; exit 1; fi

test: deps
	@$(MAKE) --no-print-directory all plain-tests asan-tests tsan-tests $(B)/asan/embkv.so venv check-layers
	@bash tests/run.sh
	@bash tests/fuzz/run.sh short

# Calls and includes go down the layers of the engine and of the binding:
# the objects' undefined symbols (nm; every variant's, for code built in
# one only) and the files' includes against the LAYERS blocks of
# ext/engine/base.h and ext/sqlite/binding.h; the binding calls the engine
# through ext/embkv.h only.
# The objects it reads are its own, each variant's flags at -O0 -g0: the
# same calls (none inlined or dropped, so any the optimizer would hide are
# seen too), built from a fresh clone in about 20 s on two CPUs where the
# optimized variants take over a minute.
define layer_variant
layers_$(1)_OBJ := $$(patsubst ext/%.c,$(B)/layers/$(1)/ext/%.o,$(ENGINE_SRC) $(SQLEXT_SRC))
$(B)/layers/$(1)/ext/%.o: ext/%.c $(HEADERS) $(GEN_HEADERS) | check-headers
	@mkdir -p $$(dir $$@)
	@$$(CC) $$($(1)_CFLAGS) $$(FILE_CFLAGS_$$*) -O0 -g0 -w -c $$< -o $$@
endef
$(foreach v,plain asan tsan,$(eval $(call layer_variant,$(v))))
layers-objects: $(layers_plain_OBJ) $(layers_asan_OBJ) $(layers_tsan_OBJ)
check-layers:
	@$(MAKE) --no-print-directory -j$$(nproc 2>/dev/null || echo 2) layers-objects
	@$(PYTHON) tests/check_layers.py $(B)/layers/plain/ext $(B)/layers/asan/ext $(B)/layers/tsan/ext

# One group of `make test` at a time (each with its sanitizer runs).
test-c: deps
	@$(MAKE) --no-print-directory plain-tests asan-tests tsan-tests
	@bash tests/run.sh c
# The SIGKILL harness alone (tests/crash/), and its long run:
# CRASH_ROUNDS kills (default 10000, about 80 minutes here).
test-crash: deps
	@$(MAKE) --no-print-directory all $(B)/asan/embkv.so venv
	@bash tests/run.sh crash
# 8 threads of mixed work on one table for SOAK_SECONDS (default 600),
# memory and the store's files sampled (bench/soak.py).
soak: deps all venv
	@$(VENV)/bin/python bench/soak.py /dev/shm/embkv-soak.$$$$ --seconds $(or $(SOAK_SECONDS),600) $(if $(SOAK_SSD_MB),--ssd-mb $(SOAK_SSD_MB))
crash-soak: deps all venv
	@bash tests/python_run.sh tests/crash/crash_sql.py --rounds $(or $(CRASH_ROUNDS),10000)
test-sql test-python: deps
	@$(MAKE) --no-print-directory all $(B)/asan/embkv.so $(if $(filter test-python,$@),venv)
	@bash tests/run.sh $(patsubst test-%,%,$@)

plain-tests: $(plain_TESTS) $(B)/pmemsim.so $(FAKECUDA)
asan-tests: $(asan_TESTS)
tsan-tests: $(tsan_TESTS)

# The stand-in driver and the GPU test built against it (FAKECUDA, above).
# Its kernels are ext/engine/gpu_kernels.cu's, compiled by the host's C++
# compiler (tests/gpu/kernels_on_cpu.cc): no operation fused, as on the GPU.
CXX_KERNELS := g++ -std=c++17 -Wall -Wextra -Werror -O2 -g -fPIC -ffp-contract=off -fno-exceptions -fno-rtti \
	-fvisibility=hidden -Itests/gpu/host
$(B)/fakecuda/kernels_on_cpu.o: tests/gpu/kernels_on_cpu.cc tests/gpu/host/cuda_fp16.h ext/engine/gpu_kernels.cu
	@mkdir -p $(dir $@)
	$(CXX_KERNELS) -c -o $@ $<
$(B)/fakecuda/libcuda.so.1: tests/gpu/fakecuda.c $(B)/fakecuda/kernels_on_cpu.o
	@mkdir -p $(dir $@)
	$(CC) $(CSTD) $(WARN) -O2 -g -fPIC -shared -I$(CUDA_HOME)/include -Wl,-soname,libcuda.so.1 -o $@ $^ -pthread -lm
$(B)/fakecuda/test_gpu_real: tests/gpu/test_gpu_real.c tests/check.h $(B)/plain/libembkv.a $(B)/fakecuda/libcuda.so.1
	$(CC) $(plain_CFLAGS) -Itests $< -o $@ $(B)/plain/libembkv.a $(LDLIBS) -L$(B)/fakecuda -l:libcuda.so.1

# Simulated persistent memory for test_powercut (an LD_PRELOAD library).
$(B)/pmemsim.so: tests/powercut/pmemsim.c tests/powercut/filesim.c tests/powercut/pmemsim.h
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -D_GNU_SOURCE -Wall -Wextra -O2 -g -fPIC -shared -o $@ tests/powercut/pmemsim.c tests/powercut/filesim.c -pthread -ldl

$(B)/bench/%: bench/%.c bench/bench_common.h bench/bench_baseline.h $(B)/plain/libembkv.a $(HEADERS) | $(B)/bench
	$(CC) $(CFLAGS) -O3 -march=native -Ibench $< -o $@ $(B)/plain/libembkv.a $(LDLIBS) -lsqlite3
$(B)/bench:
	mkdir -p $@

bench: deps $(patsubst bench/%.c,$(B)/bench/%,$(BENCH_SRC)) venv
	@bash bench/run.sh

# The larger-than-memory benchmark: embkv against RocksDB and LMDB, each run
# in a memory cgroup (needs root).  bench/ltm.sh installs librocksdb-dev and
# liblmdb-dev when missing, then builds $(B)/bench/bench_ltm through this
# rule; LTM_ROWS, LTM_MEM, LTM_BATCHES, LTM_KEEP: see bench/ltm.sh.
$(B)/bench/bench_ltm: bench/bench_ltm.c bench/bench_common.h $(B)/plain/libembkv.a $(HEADERS) | $(B)/bench
	$(CC) $(CFLAGS) -O3 -march=native -Ibench $< -o $@ $(B)/plain/libembkv.a -lrocksdb -llmdb $(LDLIBS)

bench-ltm: deps
	@bash bench/ltm.sh

# The GPU machine's kit (docs/gpu.md, tests/gpu/run.sh): the GPU test, the
# extension, the engine library and the shared libraries they need that such
# a machine lacks (Debian's; not glibc's, not the CUDA driver), in build/gpu.
GPU_KIT := $(B)/gpu
# (DT_RPATH, not RUNPATH: it also serves the libraries those libraries
# load, and only them: no LD_LIBRARY_PATH puts Debian's ahead of the
# machine's for the rest of a process, torch's included)
GPU_KIT_RPATH := -Wl,--disable-new-dtags,-rpath,'$$ORIGIN/lib'
gpu-bundle: all
	@test "$(CUDA)" = 1 || { echo "gpu-bundle: the CUDA part is not built (no nvcc, or CUDA=0)" >&2; exit 1; }
	rm -rf $(GPU_KIT) && mkdir -p $(GPU_KIT)/lib
	$(CC) $(CFLAGS) -Itests tests/gpu/test_gpu_real.c -o $(GPU_KIT)/test_gpu_real $(B)/plain/libembkv.a $(LDLIBS) \
	    -L$(CUDA_HOME)/lib64/stubs -lcuda $(GPU_KIT_RPATH)
	$(CC) -shared -Wl,-z,defs -Wl,-z,nodelete -Wl,--version-script=ext/sqlite/embkv.map -o $(GPU_KIT)/embkv.so \
	    $(plain_SQLEXT_OBJ) $(B)/plain/libembkv.a $(LDLIBS) $(GPU_KIT_RPATH)
	$(CC) -shared -Wl,-soname,libembkv.so.$(SOVERSION) -Wl,-z,defs -Wl,--version-script=ext/libembkv.map \
	    -o $(GPU_KIT)/libembkv.so $(plain_ENGINE_OBJ) $(LDLIBS) $(GPU_KIT_RPATH)
	ldd $(GPU_KIT)/test_gpu_real $(GPU_KIT)/embkv.so $(GPU_KIT)/libembkv.so | awk '$$2 == "=>" && $$3 ~ /^\// {print $$3}' | \
	    sort -u | grep -Ev '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*|libcuda)\.so' | \
	    while read -r f; do cp -L "$$f" $(GPU_KIT)/lib/; done
	@du -sh $(GPU_KIT)

demo: deps all
	@bash sql/demo.sh

# The CTR model of pysample/train_ctr.py, about a minute on 2 cores; the
# database and the curves go to build/ctr-demo.db(.png).
demo-train: deps all venv
	@bash pysample/run.sh pysample/train_ctr.py --db $(B)/ctr-demo.db --fresh --workers 2 --staleness 4

# TransE on WordNet (pysample/train_kg.py) with its entities in embkv and the
# same model in torch's memory beside it; then sql/kg.sql over the result.
demo-kg: deps all venv
	@bash pysample/run.sh pysample/train_kg.py --db $(B)/kg-demo.db --memory
	@sqlite3 -cmd '.load $(B)/embkv' $(B)/kg-demo.db < sql/kg.sql

clean:
	rm -rf $(B)

include tests/fuzz/fuzz.mk
