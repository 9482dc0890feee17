# plexus: the two set-up commands are `make demo` and `make check`.
#
#   make demo        install what is missing, build, run the main job
#   make check       install what is missing, build, run the fast tests
#   make check-asan  the fast tests under AddressSanitizer + UBSan
#   make check-tsan  the concurrency suites under ThreadSanitizer (label tsan)
#   make check-tsan-full  every fast test under it (label notsan skipped)
#   make check-slow  the tests labelled slow
#   make check-gpu   the tests labelled gpu (an NVIDIA GPU; skipped without one)
#   make bench       benchmarks, with figures and ratios against baselines
#   make fuzz        libFuzzer targets, a bounded run each (FUZZ_SECONDS)
#   make format      clang-format the sources (format-check: verify)
#   make install     the command, library, man pages, systemd units and
#                    recipes (PREFIX, default /usr/local; DESTDIR honoured)

BUILD      ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
FUZZ_BUILD ?= build-fuzz
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
FUZZ_SECONDS ?= 30
WERROR     ?= 0
CMAKE_FLAGS = -DPX_WERROR=$(if $(filter 1,$(WERROR)),ON,OFF)
PREFIX     ?= /usr/local

.PHONY: all deps build install demo check check-asan check-tsan check-tsan-full tsan-build check-slow check-gpu bench fuzz format format-check clean

all: build

deps:
	@./scripts/install-deps

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

demo: build
	@./scripts/demo $(BUILD)

check: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -LE 'slow|gpu'

# ThreadSanitizer: CI runs the suites that drive threads (label tsan);
# check-tsan-full runs every fast test but those too long under its
# slowdown (label notsan), which still run in check and check-asan.
TSAN_ENV = TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1

tsan-build: deps
	cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPX_TSAN=ON $(CMAKE_FLAGS)
	cmake --build $(TSAN_BUILD) -j $(JOBS)

check-tsan: tsan-build
	cd $(TSAN_BUILD) && $(TSAN_ENV) ctest --output-on-failure -j $(JOBS) -L '^tsan$$' -LE 'slow|gpu'

check-tsan-full: tsan-build
	cd $(TSAN_BUILD) && $(TSAN_ENV) ctest --output-on-failure -j $(JOBS) -LE 'slow|notsan|gpu'

check-slow: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -L slow

check-gpu: build
	cd $(BUILD) && ctest --output-on-failure -V -L gpu

check-asan: deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DPX_SANITIZE=ON $(CMAKE_FLAGS)
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --output-on-failure -j $(JOBS) -LE 'slow|gpu'

bench: build
	cmake --build $(BUILD) -j $(JOBS) --target benches
	@./scripts/bench $(BUILD)

fuzz: deps
	CC=clang cmake -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=Debug -DPX_FUZZ=ON
	cmake --build $(FUZZ_BUILD) -j $(JOBS)
	@./scripts/fuzz $(FUZZ_BUILD) $(FUZZ_SECONDS)

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

format-check:
	clang-format --dry-run -Werror $$(git ls-files '*.c' '*.h')

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) $(FUZZ_BUILD)
