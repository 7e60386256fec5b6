# The two commands of the README: `make demo` (the main job) and `make test`.
# Both install what is missing into .venv first: torch's CPU build, then DeepSpeed (built
# against that torch, hence --no-build-isolation), then fincheck itself with its dev tools.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_VERSION ?= 2.13.0
# Local copy of the benchmark files (else `fincheck prepare` downloads the pinned originals).
DATA_DIR ?= $(abspath $(or $(FINCHECK_DATA_DIR),$(wildcard ../shared/data)))
DEMO_DIR ?= runs/demo
PYTEST_ARGS ?=

RAG_VENV ?= .venv-rag
RAG_BIN := $(RAG_VENV)/bin

.PHONY: install install-llama-cpp llama-server rag-venv demo test test-fast lint format clean

# A venv holding fincheck with its dev tools: $(call fincheck_venv,FOLDER).
define fincheck_venv
	test -x $(1)/bin/python || $(PYTHON) -m venv $(1)
	$(1)/bin/python -m pip install -q --upgrade pip
	$(1)/bin/python -m pip install -q torch==$(TORCH_VERSION)
	$(1)/bin/python -m pip install -q --no-build-isolation deepspeed
	$(1)/bin/python -m pip install -q -e ".[dev]"
endef

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(call fincheck_venv,$(VENV))
	touch $@

# llama.cpp and its OpenAI-compatible server (llama-cpp-python, built from source: about 5
# minutes on 2 cores): `fincheck export --gguf --type q*` and the CPU-serving tests.
install-llama-cpp: $(VENV)/.installed-llama-cpp

$(VENV)/.installed-llama-cpp: $(VENV)/.installed
	$(BIN)/python -m pip install -q -e ".[dev,llama-cpp]"
	touch $@

# llama.cpp's own C++ server, from the llama.cpp that llama-cpp-python's pinned source archive
# carries (cmake, about 6 minutes on 2 cores; then cached): the CPU-serving tests run both.
llama-server: install
	$(BIN)/python scripts/build_llama_server.py

# DeepEval and Ragas, for the detector as their metric, in a venv of their own: deepeval pins
# click<8.4 and ragas (through instructor) openai<2, while transformers needs
# huggingface_hub>=1.31, which needs click>=8.4.2. So they go in after fincheck, and then what
# transformers needs goes back in (pip then says deepeval's click pin is not met; it runs).
# The [rag] extra's pins, asked alone: with fincheck's own requirements beside them pip would
# have to reconcile deepeval's click pin with transformers' and backtracks for an hour.
RAG_PINS := "deepeval==4.3.1" "ragas==0.4.3" "langchain-community>=0.3,<0.4"
rag-venv: $(RAG_VENV)/.installed

$(RAG_VENV)/.installed: pyproject.toml
	$(call fincheck_venv,$(RAG_VENV))
	$(RAG_BIN)/python -m pip install -q $(RAG_PINS)
	$(RAG_BIN)/python -m pip install -q "huggingface_hub>=1.31" "click>=8.4.2" "datasets>=5.2"
	touch $@

# fetch SmolLM2-135M -> prepare -> eval the base -> LoRA SFT (DeepSpeed, 2 CPU processes) -> eval the adapter -> score -> report
demo: install
	FINCHECK_DATA_DIR=$(DATA_DIR) $(BIN)/python scripts/demo.py --out $(DEMO_DIR)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Everything: the fast tier plus the real training runs, 2-process DeepSpeed, benchmarks.
# The RAG metrics' tests run again in their venv (skipped in the first run, which lacks them),
# with a llama.cpp server started from the main venv.
test: lint install-llama-cpp llama-server rag-venv
	FINCHECK_DATA_DIR=$(DATA_DIR) FINCHECK_LLAMA_SERVER=$$($(BIN)/python scripts/build_llama_server.py) \
		$(BIN)/python -m pytest -m "" $(PYTEST_ARGS)
	FINCHECK_DATA_DIR=$(DATA_DIR) FINCHECK_LLAMA_SERVER_PYTHON=$(abspath $(BIN)/python) \
		$(RAG_BIN)/python -m pytest -m "" tests/test_rag_metrics.py $(PYTEST_ARGS)

# The hermetic fast tier (plain pytest's default, pyproject.toml): no data folder, no fetched
# weights, no server, one process.
test-fast: install
	$(BIN)/python -m pytest $(PYTEST_ARGS)

format: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

clean:
	rm -rf $(VENV) $(RAG_VENV) runs .pytest_cache .ruff_cache
