"""The reference pages are generated from the code: a change to the schema or
the CLI that is not regenerated into docs/ fails here."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"


def generator():
    spec = importlib.util.spec_from_file_location("docs_generate", DOCS / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("page", ["dsl.md", "cli.md"])
def test_the_reference_page_matches_the_code(page):
    made = generator().PAGES[page]()
    assert (DOCS / page).read_text() == made, f"docs/{page} is stale: run python docs/generate.py"


def test_every_cli_command_and_option_is_on_the_page():
    import typer

    from archsearch.cli import app

    page = (DOCS / "cli.md").read_text()
    root = typer.main.get_command(app)
    for name, command in root.commands.items():
        assert f"## `archsearch {name}" in page
        for param in command.params:
            for flag in getattr(param, "opts", []):
                if flag.startswith("--"):
                    assert f"`{flag}`" in page, (name, flag)


def test_every_study_key_is_on_the_page():
    from archsearch.space.schema import Study

    page = (DOCS / "dsl.md").read_text()
    for name in Study.model_fields:
        assert f"| `{name}` |" in page, name
