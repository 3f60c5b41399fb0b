"""Structural rules of the house: which packages may import what."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def imports_of(folder: Path) -> dict[Path, set[str]]:
    out = {}
    for path in folder.rglob("*.py"):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
                if node.module.startswith("archsearch.cli"):
                    names.add("archsearch.cli")
        out[path] = names
    return out


FORBIDDEN = {
    "archsearch/space": {"torch", "ray", "optuna", "duckdb", "triton"},
    "archsearch/store": {"torch", "ray", "optuna", "triton"},
    "archsearch/analysis": {"torch", "ray", "optuna", "triton"},
    "archsearch/arch": {"ray", "optuna", "duckdb"},
    "archsearch/train": {"ray", "optuna", "duckdb"},
    "archsearch/data": {"ray", "optuna", "duckdb"},
    "kernels": {"ray", "optuna", "duckdb"},
}


@pytest.mark.parametrize("package", list(FORBIDDEN))
def test_forbidden_imports(package):
    for path, names in imports_of(ROOT / package).items():
        assert not names & FORBIDDEN[package], f"{path.relative_to(ROOT)} imports {names & FORBIDDEN[package]}"


def test_nothing_imports_the_cli():
    for folder in ("archsearch", "dashboards", "kernels"):
        for path, names in imports_of(ROOT / folder).items():
            if path.name != "cli.py":
                assert "archsearch.cli" not in names, path


def test_torch_free_packages_load_without_torch():
    code = ("import sys, archsearch.space, archsearch.store, archsearch.analysis, archsearch.space.expr;"
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_help_does_not_import_torch_or_ray():
    code = ("import sys; from typer.testing import CliRunner; from archsearch.cli import app;"
            "r = CliRunner().invoke(app, ['--help']); assert r.exit_code == 0, r.output;"
            "sys.exit(bool({'torch', 'ray', 'duckdb'} & set(sys.modules)))")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_space_imports_nothing_of_data():
    """The schema lists task names itself; what only a task class knows (vocabulary,
    sequence length) the planner asks archsearch.data, so the arrow runs one way.
    Function-level imports count too: they are the ones that made the cycle."""
    for path in (ROOT / "archsearch/space").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            modules = [alias.name for alias in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            for module in modules:
                assert not (module == "archsearch.data" or module.startswith("archsearch.data.")), \
                    f"{path.relative_to(ROOT)} imports {module}"
