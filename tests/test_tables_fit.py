"""Every table the commands print reads at 80 and 120 columns and piped: no line longer than the
terminal, no word split across lines (an id, a family, `mamba2.d_state=128`, a number), and what
does not fit is left out with a line that says so, never folded into letters. The store is the
hard case: four families with conditional axes, three seeds, long labels."""

from __future__ import annotations


import pytest
from typer.testing import CliRunner

from archsearch.cli import app
from tests.analysis_support import write_store

FAMILIES = {"transformer": {}, "mamba": {"mamba.d_state": 16}, "mamba2": {"mamba2.d_state": 128},
            "gdn": {"gdn.head_dim": 64}}


@pytest.fixture
def store(tmp_path):
    trials = []
    for index, (family, extra) in enumerate(FAMILIES.items()):
        for size in (2e5, 5e5, 1e6, 2e6):
            for seed in range(3):
                axes = {"family": family, **extra, "taper.shape": "cosine", "num_layers": 4}
                loss = 1.5 + (40 + 5 * index) * size**-0.3 + 0.001 * seed
                trials.append(dict(family=family, params=int(size), achieved=size, target=size, val_loss=loss,
                                   tokens_per_s=1e9 / size, axes=axes, seed=seed, train_loss=loss - 0.01))
    return write_store(tmp_path / "four.duckdb", trials=trials)


COMMANDS = {
    "status": ["status"],
    "pareto": ["pareto", "--objectives", "val_loss,params,tokens_per_s:max"],
    "fit": ["fit"],
    "compare": ["compare", "--baseline", "transformer", "--within", "target"],
}


def _words(text: str) -> set[str]:
    return set(text.split())


def _run(command: str, store, monkeypatch, columns: str | None) -> str:
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    result = CliRunner().invoke(app, [*COMMANDS[command], "--store", str(store)])
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_table_reads_at_the_terminals_width(command, width, store, monkeypatch):
    out = _run(command, store, monkeypatch, str(width))
    too_long = [line for line in out.splitlines() if len(line) > width and not line.startswith("studies in /")]
    assert not too_long, "\n".join(too_long)
    # a value split across lines leaves pieces of it as words the unsplit (piped) output never has
    whole = _words(_run(command, store, monkeypatch, None))
    told = {line for line in out.splitlines() if "left out to fit" in line or line.startswith(("note:", "same in"))}
    pieces = {w for w in _words(out) - whole - _words(" ".join(told)) if set(w) != {"─"}}  # rules fit the width
    assert not pieces, (sorted(pieces), out)
    if command in ("status", "compare"):
        assert "mamba2.d_state=128" in _words(out) or "mamba2" in _words(out), out
    assert "…" not in out


@pytest.mark.parametrize("command", list(COMMANDS))
def test_piped_output_is_as_wide_as_its_widest_row(command, store, monkeypatch):
    """Piped (no terminal, no COLUMNS), a table keeps every column on one line per row: the
    output is as wide as its rows, not cut to 80 nor padded to a fixed width."""
    out = _run(command, store, monkeypatch, None)
    assert "left out to fit" not in out
    rule = max((line for line in out.splitlines() if set(line) == {"─"}), key=len, default="")
    assert rule and max(len(line) for line in out.splitlines()) < 1000
    for line in out.splitlines():  # no row of a table wraps: none is longer than its rule...
        assert len(line.rstrip()) <= max(len(rule), len(line.rstrip())) and not line.startswith("  ─")


def test_a_column_that_cannot_fit_is_left_out_and_said(store, monkeypatch):
    """At 50 columns the status table keeps its ids and statuses, drops what gives way first
    (the gap, the speed, ...) and says so; --wide shows every column at full width."""
    monkeypatch.setenv("COLUMNS", "50")
    narrow = CliRunner().invoke(app, ["status", "--store", str(store)]).output
    assert "left out to fit 50 columns: gap" in " ".join(narrow.split())
    assert "mamba2.d_state=128" in _words(narrow) and "completed" in _words(narrow)
    wide = CliRunner().invoke(app, ["status", "--store", str(store), "--wide"]).output
    assert "left out" not in wide and "gap" in _words(wide)
