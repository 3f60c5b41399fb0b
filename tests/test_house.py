"""Structural rules of the house: which packages may import what."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


# the top-level packages: each folder is its import name
PACKAGES = ("archsearch", "archsearch_kernels", "archsearch_dashboards")


def module_name(path: Path) -> str:
    """The dotted import name of a file under ROOT: archsearch_kernels/gated_delta/naive.py ->
    archsearch_kernels.gated_delta.naive; a package's __init__.py names the package."""
    folder, *rest = path.relative_to(ROOT).with_suffix("").parts
    assert folder in PACKAGES, path
    parts = [folder, *rest]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source: str, module: str, *, is_package: bool = False) -> set[str]:
    """Every module ``source`` (the text of module ``module``) may import, in full
    and with every dotted prefix: ``import a.b.c`` gives a, a.b and a.b.c;
    ``from a.b import c`` also gives a.b.c (c may be a submodule); relative
    imports are resolved against ``module`` (``from ..cli import app`` in
    archsearch.store.duck gives archsearch.cli)."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            origin = ".".join(base + ([node.module] if node.module else []))
            found |= {origin} | {f"{origin}.{alias.name}" for alias in node.names if alias.name != "*"}
    return {".".join(name.split(".")[:i]) for name in found if name for i in range(1, name.count(".") + 2)}


def imports_of(folder: Path) -> dict[Path, set[str]]:
    """``imported_modules`` of every Python file under ``folder``."""
    return {path: imported_modules(path.read_text(), module_name(path), is_package=path.name == "__init__.py")
            for path in folder.rglob("*.py")}


def test_the_import_helper_sees_full_dotted_and_relative_imports():
    """The helper the rules below rely on, on planted imports. Fails on the
    mutation that keeps only the first dotted part (``name.split(".")[:i]`` ->
    ``name.split(".")[:1]``), as the helper did before, and on one that skips
    relative imports (``if node.level`` branch -> ``continue``)."""
    planted = "import os\nimport archsearch.cli\n"
    assert {"archsearch", "archsearch.cli"} <= imported_modules(planted, "archsearch.store.duck")
    relative = "from ..cli import app\nfrom . import duck\nfrom .. import planner as p\n"
    seen = imported_modules(relative, "archsearch.store.duck")
    assert {"archsearch.cli", "archsearch.cli.app", "archsearch.store.duck", "archsearch.planner"} <= seen
    # in a package's __init__ one dot is the package itself
    assert "archsearch.store.duck" in imported_modules("from .duck import Store", "archsearch.store", is_package=True)
    assert "archsearch.cli" in imported_modules("from archsearch import cli", "archsearch.planner")
    assert "torch" in imported_modules("def f():\n    import torch.nn.functional as F\n", "archsearch.space.x")
    assert "archsearch.cli" not in imported_modules("import archsearch.client", "archsearch.planner")
    assert module_name(ROOT / "archsearch/store/duck.py") == "archsearch.store.duck"
    assert module_name(ROOT / "archsearch_kernels/gated_delta/__init__.py") == "archsearch_kernels.gated_delta"


FORBIDDEN = {
    "archsearch/space": {"torch", "ray", "optuna", "duckdb", "triton"},
    "archsearch/store": {"torch", "ray", "optuna", "triton"},
    "archsearch/analysis": {"torch", "ray", "optuna", "triton"},
    "archsearch/arch": {"ray", "optuna", "duckdb", "triton"},
    "archsearch/train": {"ray", "optuna", "duckdb", "triton"},
    "archsearch/data": {"ray", "optuna", "duckdb", "triton"},
    "archsearch_kernels": {"ray", "optuna", "duckdb"},
}


def test_every_package_at_the_top_is_named_archsearch_something():
    """The checkout's root is on sys.path under pytest and `python -m`, so a top-level package
    there hides any installed one of the same name: a `kernels/` folder once hid Hugging Face's
    `kernels`, which transformers imports. Only the test suite's own package may go unprefixed."""
    packages = {path.parent.name for path in ROOT.glob("*/__init__.py")}
    assert packages - {"tests"} == set(PACKAGES)


@pytest.mark.parametrize("package", list(FORBIDDEN))
def test_forbidden_imports(package):
    for path, names in imports_of(ROOT / package).items():
        assert not names & FORBIDDEN[package], f"{path.relative_to(ROOT)} imports {names & FORBIDDEN[package]}"


def test_triton_is_imported_only_under_kernels_and_only_by_kernel_files():
    """triton is an optional extra: nothing outside archsearch_kernels/ names it, and inside archsearch_kernels/ only
    the kernel files do (kernel.py; chunked_kernel.py where an op has a second kernel; each
    package's __init__ imports them on first use)."""
    for folder in PACKAGES:
        for path, names in imports_of(ROOT / folder).items():
            if "triton" in names:
                rel = path.relative_to(ROOT)
                assert rel.parts[0] == "archsearch_kernels" and path.name.endswith("kernel.py"), rel


def test_models_build_and_kernels_dispatch_without_loading_triton():
    code = ("import sys; from archsearch_kernels import dispatch; from archsearch.arch.model import build_model;"
            "from archsearch.arch.spec import ArchSpec, LayerSpec; import torch;"
            "l = LayerSpec(mixer='mamba', mlp='swiglu', mlp_width=8, options={'d_state': 2});"
            "m = build_model(ArchSpec(family='t', vocab_size=9, d_model=8, num_heads=2, layers=(l,)));"
            "m(torch.zeros(1, 3, dtype=torch.long)); sys.exit('triton' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_nothing_imports_the_cli():
    for folder in PACKAGES:
        for path, names in imports_of(ROOT / folder).items():
            if path != ROOT / "archsearch" / "cli.py":
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


def test_planning_imports_no_torch():
    """``archsearch plan`` counts every family's parameters and FLOPs from the torch-free
    ``*_counts`` modules, so it imports no torch (1.4 s of a 1.9 s plan, before). Fails if
    the registry names a module class eagerly again (``Block(attention.Attention, ...)``), or
    if ``archsearch.data._base`` imports torch at the top."""
    code = ("import sys; from typer.testing import CliRunner; from archsearch.cli import app;"
            "runner = CliRunner();"
            "[runner.invoke(app, ['plan', s]) for s in ('studies/quickstart.yaml', 'studies/zoo_smoke.yaml')];"
            "r = runner.invoke(app, ['plan', 'studies/zoo_smoke.yaml']); assert r.exit_code == 0, r.output;"
            "assert 'family=hope' in r.output and 'family=mamba' in r.output, r.output;"
            "sys.exit(bool({'torch', 'ray'} & set(sys.modules)))")
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


def test_counting_formulas_import_no_torch():
    """Every ``*_counts.py`` beside a block or structure is importable without torch:
    directly, and through what it imports."""
    counts = sorted((ROOT / "archsearch/arch").rglob("*_counts.py"))
    assert len(counts) >= 12
    for path in counts:
        assert "torch" not in imported_modules(path.read_text(), module_name(path)), path.relative_to(ROOT)
    code = ("import sys, importlib;" + "".join(f"importlib.import_module({module_name(p)!r});" for p in counts)
            + "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0
