# tests/fuzz/fuzz.mk - the libFuzzer build of embkv (included by the Makefile).
#
# Owns: the fuzz targets tests/fuzz/fuzz_<name>.c, each linked with
# tests/fuzz/common.c and with the engine and binding sources compiled
# once more by clang-14 with coverage instrumentation and ASan+UBSan into
# $(B)/fuzz/ (a separate object directory: the other variants are gcc's, and
# libFuzzer's instrumentation must not reach them).  The same -std, -D and
# -I flags as the other variants, so the code under test is the code built.
#
#   make fuzz-build    builds $(B)/fuzz/fuzz_<name> for every target
#   make fuzz          runs each target long (FUZZ_SECONDS each, default 600)
#   `make test` ends with the short pass (tests/fuzz/run.sh short).

FUZZ_CC    ?= clang-14
FUZZ_SAN   := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
FUZZ_FLAGS := $(CSTD) $(WARN) -O1 -g -pthread -Iext -Iext/engine -Iext/sqlite $(FUZZ_SAN)
FUZZ_SRC   := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_BINS  := $(patsubst tests/fuzz/%.c,$(B)/fuzz/%,$(FUZZ_SRC))
FUZZ_OBJ   := $(patsubst ext/%.c,$(B)/fuzz/ext/%.o,$(ENGINE_SRC) $(SQLEXT_SRC))

.PHONY: fuzz fuzz-build
# (kept: make would delete them as intermediates of the pattern rules)
.SECONDARY: $(FUZZ_OBJ) $(B)/fuzz/common.o
fuzz-build: $(FUZZ_BINS)

$(B)/fuzz/ext/%.o: ext/%.c $(HEADERS) | check-headers
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer-no-link -c $< -o $@

# (the harness itself without coverage: its branches are not the code under test)
$(B)/fuzz/common.o: tests/fuzz/common.c tests/fuzz/common.h $(HEADERS) | check-headers
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) -c $< -o $@

$(B)/fuzz/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/common.h $(B)/fuzz/common.o $(FUZZ_OBJ)
	$(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer $< $(B)/fuzz/common.o $(FUZZ_OBJ) -o $@ $(LDLIBS) -lsqlite3

fuzz: deps
	@$(MAKE) --no-print-directory fuzz-build
	@bash tests/fuzz/run.sh long
