"""The mutation check (tools/mutation_check.py) cannot go stale silently: every
mutant's text is in its file exactly once, each names tests that exist, and
docs/testing.md gives the number of mutants the script holds."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def mutants():
    spec = importlib.util.spec_from_file_location("mutation_check", ROOT / "tools" / "mutation_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module.MUTANTS


def test_every_mutant_still_finds_its_text_once_and_its_tests():
    found = mutants()
    assert len(found) >= 30
    for mutant in found:
        assert (ROOT / mutant.path).read_text().count(mutant.old) == 1, f"{mutant.path}: {mutant.what}"
        assert mutant.new != mutant.old
        assert all((ROOT / test.split("::")[0]).is_file() for test in mutant.tests), mutant.tests


def test_the_docs_give_the_number_of_mutants():
    text = (ROOT / "docs" / "testing.md").read_text()
    assert f"{len(mutants())} mutants" in text
