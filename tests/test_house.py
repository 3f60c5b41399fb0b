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
    "archsearch/arch": {"ray", "optuna", "duckdb", "triton"},
    "archsearch/train": {"ray", "optuna", "duckdb", "triton"},
    "archsearch/data": {"ray", "optuna", "duckdb", "triton"},
    "kernels": {"ray", "optuna", "duckdb"},
}


@pytest.mark.parametrize("package", list(FORBIDDEN))
def test_forbidden_imports(package):
    for path, names in imports_of(ROOT / package).items():
        assert not names & FORBIDDEN[package], f"{path.relative_to(ROOT)} imports {names & FORBIDDEN[package]}"


def test_triton_is_imported_only_under_kernels_and_only_by_kernel_files():
    """triton is an optional extra: nothing outside kernels/ names it, and inside kernels/ only
    the kernel.py files do (each package's __init__ imports them on first use)."""
    for folder in ("archsearch", "dashboards", "kernels"):
        for path, names in imports_of(ROOT / folder).items():
            if "triton" in names:
                rel = path.relative_to(ROOT)
                assert rel.parts[0] == "kernels" and path.name == "kernel.py", rel


def test_models_build_and_kernels_dispatch_without_loading_triton():
    code = ("import sys; from archsearch_kernels import dispatch; from archsearch.arch.model import build_model;"
            "from archsearch.arch.spec import ArchSpec, LayerSpec; import torch;"
            "l = LayerSpec(mixer='mamba', mlp='swiglu', mlp_width=8, options={'d_state': 2});"
            "m = build_model(ArchSpec(family='t', vocab_size=9, d_model=8, num_heads=2, layers=(l,)));"
            "m(torch.zeros(1, 3, dtype=torch.long)); sys.exit('triton' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


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
