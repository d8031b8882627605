# Convenience wrapper around CMake. `make serve` runs the daemon, `make test` runs every test.
BUILD ?= build
CMAKE_FLAGS ?=
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
ARGS ?=

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

serve: build
	$(BUILD)/bin/kvpoold $(ARGS)

# `make check` (or test-quick): the normal build's tests, the quick loop. `make test`, which is
# what CI runs: check, then the suite again under ASan+UBSan and under TSan (separate build
# directories, the daemon under test sanitized too); it stops at the first failure.
test:
	$(MAKE) --no-print-directory check
	$(MAKE) --no-print-directory test-asan
	$(MAKE) --no-print-directory test-tsan

check test-quick: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# Sanitizer builds. Python tests load libkvpool.so into an unsanitized interpreter: not run
# there. scripts/sanitized-ctest.sh also fails on a report from any daemon a test started.
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
SAN_CMAKE_FLAGS = $(CMAKE_FLAGS) -DKVP_BENCH=OFF
SAN_ENV = ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1"

.PHONY: check test-quick test-asan test-tsan

$(ASAN_BUILD)/CMakeCache.txt:
	cmake -S . -B $(ASAN_BUILD) $(SAN_CMAKE_FLAGS) -DKVP_ASAN=ON

$(TSAN_BUILD)/CMakeCache.txt:
	cmake -S . -B $(TSAN_BUILD) $(SAN_CMAKE_FLAGS) -DKVP_TSAN=ON

test-asan: deps $(ASAN_BUILD)/CMakeCache.txt
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	$(SAN_ENV) scripts/sanitized-ctest.sh $(ASAN_BUILD) -j $(JOBS) -LE python

# Single-threaded fuzz corpus replays gain nothing under TSan.
test-tsan: deps $(TSAN_BUILD)/CMakeCache.txt
	cmake --build $(TSAN_BUILD) -j $(JOBS)
	$(SAN_ENV) scripts/sanitized-ctest.sh $(TSAN_BUILD) -j $(JOBS) -LE 'python|fuzz'

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD)

# Benchmarks (docs/PERFORMANCE.md): installs the comparators (redis-server, hiredis, gnuplot)
# through the deps script, reconfigures so that hiredis is found, runs the default sweep and
# writes results.csv, results.json and throughput.png into $(BUILD)/bench.
# Extra options through BENCH_ARGS, e.g. make bench BENCH_ARGS="--workers 2".
BENCH_ARGS ?=

.PHONY: bench demo

bench:
	@scripts/install-deps.sh bench
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j $(JOBS) --target kvpool-bench
	mkdir -p $(BUILD)/bench
	$(BUILD)/bin/kvpool-bench --csv $(BUILD)/bench/results.csv \
		--json $(BUILD)/bench/results.json --png $(BUILD)/bench/throughput.png $(BENCH_ARGS)

# A first look: a private daemon, one worker on shared memory, one forced inline.
demo: build
	$(BUILD)/bin/kvpool-demo
