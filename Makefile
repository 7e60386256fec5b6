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

.PHONY: install demo test test-fast lint format clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==$(TORCH_VERSION)
	$(BIN)/python -m pip install -q --no-build-isolation deepspeed
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $@

# fetch SmolLM2-135M -> prepare -> eval the base -> LoRA SFT (DeepSpeed, 2 CPU processes) -> eval the adapter -> score -> report
demo: install
	FINCHECK_DATA_DIR=$(DATA_DIR) $(BIN)/python scripts/demo.py --out $(DEMO_DIR)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Everything: the fast tier plus the real training runs, 2-process DeepSpeed, benchmarks.
test: lint
	FINCHECK_DATA_DIR=$(DATA_DIR) $(BIN)/python -m pytest -m "" $(PYTEST_ARGS)

# The hermetic fast tier (plain pytest's default, pyproject.toml): no data folder, no fetched
# weights, no server, one process.
test-fast: install
	$(BIN)/python -m pytest $(PYTEST_ARGS)

format: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
