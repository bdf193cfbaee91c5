# Short commands over the CMake build. See README.md.

# No "make[1]: Entering directory" lines: cmake --build runs make again
# underneath, and those lines would come before anything a person reads.
# For the same reason CMAKE_GEN turns off CMake's "Built target X" lines
# (CMAKE_TARGET_MESSAGES): a build with nothing to do prints nothing, one
# that compiles still shows its progress.
MAKEFLAGS += --no-print-directory
BUILD      ?= build
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
FUZZ_TIME  ?= 60
PREFIX     ?= /usr/local
SHARED     ?= $(abspath ../shared)
CMAKE_GEN  := cmake -S . -DCMAKE_BUILD_TYPE=Release -DCMAKE_TARGET_MESSAGES=OFF

.PHONY: all deps build test test-release test-asan test-tsan test-server fuzz-smoke demo bench fuzz install clean

all: build

# Installs missing Debian packages (a no-op when all are present).
deps:
	@command -v cmake >/dev/null 2>&1 && pkg-config --exists cmocka libpcre2-8 libutf8proc hwloc libmicrohttpd libcjson 2>/dev/null \
	  && command -v clang >/dev/null 2>&1 \
	  || { echo "make: build dependencies missing; running scripts/install-deps.sh"; scripts/install-deps.sh; }

build: deps
	@$(CMAKE_GEN) -B $(BUILD) -DTERN_TESTS=OFF >/dev/null
	@cmake --build $(BUILD) -j $(JOBS) --target tern
	@echo "built $(BUILD)/tern"

# Three builds: -O2 -Werror, ASan+UBSan, TSan (tests labelled concurrent).
test: test-release test-asan test-tsan
	@echo "make test: all three builds passed"

# A short run of every libFuzzer target (CI runs it after make test).
fuzz-smoke:
	@$(MAKE) fuzz FUZZ_TIME=10

test-release: deps
	@$(CMAKE_GEN) -B $(BUILD)/test-release >/dev/null
	@cmake --build $(BUILD)/test-release -j $(JOBS)
	cd $(BUILD)/test-release && ctest --output-on-failure -j $(JOBS)

# End-to-end tests of `tern serve` (openai client, curl, headless Chromium)
# on the release build; the bad-input test uses the ASan build when it was
# built (make test-asan). scripts/install-test-deps.sh installs the tools.
test-server: deps
	@$(CMAKE_GEN) -B $(BUILD)/test-release >/dev/null
	@cmake --build $(BUILD)/test-release -j $(JOBS) --target tern
	scripts/test-server.sh --tern $(BUILD)/test-release/tern --shared "$(SHARED)" --out $(BUILD)/server-test \
	  $$([ -x $(BUILD)/test-asan/tern ] && echo --asan-tern $(BUILD)/test-asan/tern)

test-asan: deps
	@$(CMAKE_GEN) -B $(BUILD)/test-asan -DTERN_SANITIZE=address -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	@cmake --build $(BUILD)/test-asan -j $(JOBS)
	cd $(BUILD)/test-asan && TERN_TEST_QUICK=1 ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --output-on-failure -j $(JOBS)

test-tsan: deps
	@$(CMAKE_GEN) -B $(BUILD)/test-tsan -DTERN_SANITIZE=thread -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	@cmake --build $(BUILD)/test-tsan -j $(JOBS)
	cd $(BUILD)/test-tsan && TERN_TEST_QUICK=1 TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
	  ctest --output-on-failure -j $(JOBS) -L concurrent

demo: build
	@scripts/demo.sh $(BUILD)/tern "$(SHARED)"

bench: build
	$(BUILD)/tern bench pool
	$(BUILD)/tern bench kernels

# libFuzzer targets, clang. FUZZ_TIME seconds each, seeded from ../shared.
fuzz: deps
	@CC=clang $(CMAKE_GEN) -B $(BUILD)/fuzz -DTERN_FUZZ=ON -DTERN_TESTS=OFF -DTERN_SANITIZE=address \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	@cmake --build $(BUILD)/fuzz -j $(JOBS)
	@scripts/fuzz.sh $(BUILD)/fuzz $(FUZZ_TIME) "$(SHARED)"

install: build
	install -D -m 755 $(BUILD)/tern $(DESTDIR)$(PREFIX)/bin/tern

clean:
	rm -rf $(BUILD)
