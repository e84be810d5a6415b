# The two set-up commands (README.md):
#   make run    install missing packages, build, fetch the default model, generate
#   make test   build, run the unit + golden tests, the sanitizer build and the fuzzers
# Everything else is a step of those two.

BUILD      ?= build
ASAN_BUILD ?= build-asan
FUZZ_BUILD ?= build-fuzz
TSAN_BUILD ?= build-tsan
CUDA_BUILD ?= build-cuda
NVCC       ?= $(shell command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
JOBS       ?= $(shell nproc)
MODEL      ?= smollm2-135m
PROMPT     ?= In one sentence, what is the capital of France and why is it famous?
FUZZ_SECONDS ?= 30
LUMEN      := $(BUILD)/lumen

.PHONY: all deps build run pull pull-test-models test test-unit test-golden test-extended test-asan test-tsan test-fuzz test-cuda-build clean

all: build

deps:
	@scripts/install_deps.sh

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD) -j$(JOBS)

pull: build
	$(LUMEN) pull $(MODEL)

run: pull
	$(LUMEN) run $(MODEL) -p "$(PROMPT)"

# The real models the default tests use (tests that need a model skip, visibly,
# when it is absent; CI pulls them first so nothing skips).
TEST_MODELS ?= smollm2-135m gemma3-270m

# Unit + end-to-end tests, the golden tests on the real models, the sanitizer
# builds (ASan/UBSan; TSan on the threaded tests), a bounded run of every fuzzer, and
# the CUDA backend compiled. The suites that run the most tests come last, so the end
# of the log shows their counts.
test: test-cuda-build test-fuzz test-tsan test-asan test-unit test-golden
	@echo "make test: every suite passed (CUDA build, fuzz, TSan, ASan/UBSan, unit + e2e, golden)"

pull-test-models: build
	$(LUMEN) pull $(TEST_MODELS)

test-unit: pull-test-models
	cd $(BUILD) && ctest --output-on-failure -LE "golden|fuzz|e2e" -j$(JOBS)
	cd $(BUILD) && ctest --output-on-failure -L e2e

test-golden: pull-test-models
	cd $(BUILD) && ctest --output-on-failure -L golden -LE extended

# The 1.5B model: minutes on two cores, so not in the default run.
test-extended: build
	$(LUMEN) pull qwen2.5-coder-1.5b
	cd $(BUILD) && ctest --output-on-failure -L extended

test-asan: deps
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DLUMEN_SANITIZE=ON >/dev/null
	@cmake --build $(ASAN_BUILD) -j$(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
		ctest --output-on-failure -LE "golden|fuzz|e2e" -j$(JOBS)

# The threaded tests (the engine: worker thread, jobs, streaming from many threads,
# cancellation, close with jobs queued) under ThreadSanitizer, in their own build.
test-tsan: deps
	@cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DLUMEN_TSAN=ON >/dev/null
	@cmake --build $(TSAN_BUILD) -j$(JOBS) --target test_engine test_engine_stress test_prefix_cache
	cd $(TSAN_BUILD) && TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
		ctest --output-on-failure -R "^(test_engine|test_engine_stress|test_prefix_cache)$$"

test-fuzz: deps
	@cmake -S . -B $(FUZZ_BUILD) -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=Debug \
		-DLUMEN_FUZZ=ON -DLUMEN_SANITIZE=ON -DLUMEN_FUZZ_SECONDS=$(FUZZ_SECONDS) >/dev/null
	@cmake --build $(FUZZ_BUILD) -j$(JOBS) --target fuzzers
	cd $(FUZZ_BUILD) && ctest --output-on-failure -L fuzz

# The CUDA backend compiled with nvcc (sm_90a machine code + compute_90 PTX) and its
# op tests, which report themselves skipped where there is no GPU; on the GPU machine
# bench/cuda_quick_run.sh runs them for real.
test-cuda-build: deps
	@if [ -z "$(NVCC)" ]; then echo "SKIPPED: test-cuda-build: no nvcc (install the CUDA toolkit)"; exit 0; fi; \
	cmake -S . -B $(CUDA_BUILD) -DCMAKE_BUILD_TYPE=Release -DLUMEN_CUDA=ON -DCMAKE_CUDA_COMPILER=$(NVCC) >/dev/null && \
	cmake --build $(CUDA_BUILD) -j$(JOBS) --target lumen_cli test_backend_ops test_topk_cuda && \
	cd $(CUDA_BUILD) && ctest --output-on-failure -R '^(test_backend_ops|test_topk_cuda)$$'

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD) $(TSAN_BUILD) $(CUDA_BUILD)
