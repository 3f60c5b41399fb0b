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


def test_every_figure_in_performance_md_names_the_command_that_made_it():
    """Each top-level section of docs/performance.md that states measured
    figures (a table, or a number with a unit) shows the command that
    produced them, and that command's script exists."""
    import re

    root = DOCS.parent
    text = (DOCS / "performance.md").read_text()
    sections = re.split(r"^# ", text, flags=re.M)[1:]
    assert sections
    for section in sections:
        title = section.splitlines()[0]
        figures = re.search(r"^\|.*\d", section, flags=re.M) or re.search(r"\d+(\.\d+)?\s?(s|ms|x)\b", section)
        if not figures:
            continue
        fenced = re.findall(r"^```\n(.*?)^```", section, flags=re.M | re.S)
        commands = [line for block in fenced for line in block.splitlines()
                    if line.startswith(("python ", "archsearch "))]
        assert commands, f"section '{title}' states figures but names no command"
        for command in commands:
            words = command.split()
            if words[0] == "python":
                assert (root / words[1]).is_file(), f"section '{title}': {words[1]} does not exist"


def test_every_key_on_the_dsl_page_has_a_type_a_default_a_meaning_and_an_example():
    rows = [line for line in (DOCS / "dsl.md").read_text().splitlines()
            if line.startswith("| `") and not line.startswith("| key")]
    assert len(rows) > 100
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split(" | ")]
        assert len(cells) >= 5 and all(cells[:5]), row
