"""`--report-to wandb`: log the figures, the plots and report.md to a wandb run.

Works offline (`WANDB_MODE=offline` writes the run under OUT/wandb for a later `wandb sync`).
Only figures and the report are logged: no API key or judge credential is part of them.
wandb writes its files by name and links its logs; it works in a folder of its own, whose
plain files are then copied into OUT/wandb as fincheck writes every file (no link in OUT).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from fincheck.io.messages import library_errors_as_one_line
from fincheck.io.safe_files import copy_file


def flatten(results: dict) -> dict[str, float]:
    """{'qasem/cliff/bacc': 0.71, 'fhsumbench/f': 0.46, ...}: numeric leaves of results['tasks']."""
    flat: dict[str, float] = {}

    def walk(prefix: str, value) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                if key in ("ci95", "confusion", "binary_confusion", "judged_with"):
                    continue
                walk(f"{prefix}/{key}" if prefix else key, inner)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            flat[prefix] = value

    walk("", results["tasks"])
    return flat


def log_to_wandb(results: dict, out_dir: Path, project: str) -> str:
    import wandb

    staging = Path(tempfile.mkdtemp(prefix="fincheck-wandb-"))
    try:
        with library_errors_as_one_line(
            "wandb", "log in (`wandb login`, WANDB_API_KEY) or set WANDB_MODE=offline"
        ):
            return _log_run(wandb, results, out_dir, project, staging)
    finally:
        for file in sorted((staging / "wandb").rglob("*")):
            if file.is_file() and not file.is_symlink():  # its logs' links are left out
                target = out_dir / "wandb" / file.relative_to(staging / "wandb")
                target.parent.mkdir(parents=True, exist_ok=True)
                copy_file(file, target, "wandb's run")
        shutil.rmtree(staging, ignore_errors=True)


def _log_run(wandb, results: dict, out_dir: Path, project: str, staging: Path) -> str:
    run = wandb.init(
        project=project,
        dir=str(staging),
        config=results["run"],
        job_type="eval",
        # the console read at the file descriptor, after fincheck's redacting stream (the
        # default wraps sys.stdout.write and would see the text before)
        settings=wandb.Settings(console="redirect", symlink=False),
    )
    try:
        run.summary.update(flatten(results))
        images = {
            f"plots/{png.stem}": wandb.Image(str(png))
            for png in sorted((out_dir / "plots").glob("*.png"))
        }
        if images:
            run.log(images)
        artifact = wandb.Artifact(f"eval-report-{run.id}", type="eval-report")
        for name in ("report.md", "results.json"):
            if (out_dir / name).exists():
                artifact.add_file(str(out_dir / name))
        run.log_artifact(artifact)
        return run.id
    finally:
        run.finish()
