"""The wheel holds what setup.py finds: a task added as one folder under fincheck/tasks/ (its
module, prompt file and `evaluate` module) is in it with no other edit, and the stage folders
install as fincheck.<stage>."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STAGES = ("data_prep", "train", "eval", "serve")


def test_a_task_folder_is_in_the_wheel_with_no_other_edit(tmp_path):
    tree = tmp_path / "repo"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for folder in ("fincheck", *STAGES):
        shutil.copytree(REPO / folder, tree / folder, ignore=ignore)
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, tree / name)
    toy = tree / "fincheck" / "tasks" / "toy"
    (toy / "parts").mkdir(parents=True)
    (toy / "__init__.py").write_text('"""A toy task."""\n')
    (toy / "parts" / "__init__.py").write_text("")
    (toy / "prompt.txt").write_text("[system]\nCheck.\n[user]\n{text}\n")
    (toy / "fincheck_toy").mkdir()  # its `evaluate` module
    (toy / "fincheck_toy" / "fincheck_toy.py").write_text('"""A toy metric."""\n')
    out = tmp_path / "dist"
    build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps"]
    subprocess.run([*build, str(tree), "-w", str(out)], check=True, capture_output=True)
    (wheel,) = out.glob("fincheck-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for path in ("__init__.py", "prompt.txt", "parts/__init__.py", "fincheck_toy/fincheck_toy.py"):
        assert f"fincheck/tasks/toy/{path}" in names
    for stage in STAGES:
        assert f"fincheck/{stage}/__init__.py" in names
    assert "fincheck/eval/baselines/__init__.py" in names  # a stage's own sub-package
    assert "fincheck/tasks/final/reader.py" in names and "fincheck/models/models.json" in names
