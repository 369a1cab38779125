"""The packages' layers and no import cycles, as pyproject.toml's import-linter contracts state them:
``lint-imports`` keeps them on this tree, and breaks them on a copy given an upward import or a cycle."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("params", "layers", "tasks", "trainer", "tools")
LINT_IMPORTS = str(Path(sys.executable).with_name("lint-imports"))


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([LINT_IMPORTS, "--no-cache"], cwd=root, capture_output=True, text=True, timeout=120)


def test_the_packages_keep_the_import_contracts():
    result = lint_imports(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 2 kept, 0 broken." in result.stdout


def test_an_upward_import_or_a_cycle_breaks_them(tmp_path):
    for package in PACKAGES:
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "tests").mkdir()
    for name in ("__init__.py", "import_contracts.py"):
        shutil.copy(REPO / "tests" / name, tmp_path / "tests" / name)
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    assert lint_imports(tmp_path).returncode == 0

    with open(tmp_path / "layers" / "core.py", "a") as f:
        f.write("\nfrom trainer import progress  # noqa: E402\n")
    with open(tmp_path / "params" / "keys.py", "a") as f:
        f.write("\nfrom params import text_tree  # noqa: E402\n")
    with open(tmp_path / "params" / "text_tree.py", "a") as f:
        f.write("\nfrom params import keys  # noqa: E402\n")
    result = lint_imports(tmp_path)
    assert result.returncode == 1
    assert "layers is not allowed to import trainer" in result.stdout
    assert "- layers.core -> trainer.progress (l." in result.stdout
    assert "Import cycle through params.keys:" in result.stdout
    assert "Contracts: 0 kept, 2 broken." in result.stdout
