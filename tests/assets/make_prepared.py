"""Builds tests/assets/prepared/: a small prepared-data folder for the fast test tier, made by the
project's own code (the task converters, the contamination guard, the writer) from short
synthetic records in each benchmark's raw format, written in the project's own words.

Each registered task's records lie in `tests/assets/raw/<task>/`, one file per source the task
reads, under the source's own name (`qasem/dev.jsonl`, `defacto/train.jsonl`, ...): a new task
joins the fixture with its files there, without an edit here. Some documents are shared across
tasks on purpose (the contamination guard has something to find).

    python tests/assets/make_prepared.py          # rewrite tests/assets/prepared/

`tests/test_assets.py` rebuilds it into a temporary folder and checks it equals the committed
copy byte for byte, so it cannot drift from the converters.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from fincheck.data_prep.prepare import PrepareConfig, prepare_from_files
from fincheck.io.sources import sha256_file
from fincheck.tasks import get_task

HERE = Path(__file__).resolve().parent
RAW = HERE / "raw"
OUT = HERE / "prepared"


def fixture_tasks() -> list[str]:
    """The registered tasks with records here."""
    return [task for task in PrepareConfig().tasks if (RAW / task).is_dir()]


def build(out_dir: Path) -> dict:
    """Prepare every task's raw records into `out_dir`."""
    config = PrepareConfig(tasks=fixture_tasks())
    files, inputs = {}, {}
    for task in config.tasks:
        for source in get_task(task).sources(config):
            files[source.name] = path = RAW / task / source.name
            inputs[source.name] = {"sha256": sha256_file(path), "synthetic": True}
    return prepare_from_files(config, files, inputs, out_dir, progress=False, log=lambda _: None)


if __name__ == "__main__":
    manifest = build(OUT)
    print(json.dumps(manifest["counts"], indent=1))
    sys.exit(0)
