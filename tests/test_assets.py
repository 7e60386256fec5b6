"""The small prepared folder of the fast tier (tests/assets/prepared) is what the project's own
code makes from its synthetic records today (rebuild: python tests/assets/make_prepared.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ASSETS = Path(__file__).resolve().parent / "assets"


def test_the_committed_asset_equals_a_fresh_build(tmp_path):
    spec = importlib.util.spec_from_file_location("make_prepared", ASSETS / "make_prepared.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.build(tmp_path / "prepared")
    committed = sorted(
        p.relative_to(ASSETS / "prepared") for p in (ASSETS / "prepared").rglob("*.json*")
    )
    fresh = sorted(
        p.relative_to(tmp_path / "prepared") for p in (tmp_path / "prepared").rglob("*.json*")
    )
    assert committed == fresh
    for rel in committed:
        assert (ASSETS / "prepared" / rel).read_bytes() == (
            tmp_path / "prepared" / rel
        ).read_bytes(), f"{rel} is stale: run python tests/assets/make_prepared.py"


def test_every_registered_task_is_in_the_fixture():
    """A task's records join the fixture from its own folder of raw files (`tests/assets/raw/
    <task>/`, each under its source's name): every registered task has one, so the fast tier
    runs each task's converter, prompt and scorer."""
    from fincheck.tasks import task_names

    spec = importlib.util.spec_from_file_location("make_prepared", ASSETS / "make_prepared.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.fixture_tasks() == list(task_names())
    assert sorted(p.name for p in (ASSETS / "raw").iterdir()) == sorted(task_names())
