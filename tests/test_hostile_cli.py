"""Hostile input on the command line itself: CSV files for ``fit``, ``pareto`` and
``compare --from-csv``, numbers that are not finite, YAML that contains itself in ``--set``,
and the JSON every ``--json`` prints, which must parse under a parser that rejects NaN and
Infinity (JSON has neither).

Each refusal is one line naming the input and the fix, exit 2, no traceback, inside the time
and memory limits of the hostile study corpus (``run_limited``).
"""

from __future__ import annotations

import inspect
import json
import os
from pathlib import Path

import pytest
import typer

from archsearch.cli import app
from tests.analysis_support import write_store
from tests.test_hostile_files import assert_one_clean_line, run_limited

CSV_COMMANDS = {"fit": ["fit"], "pareto": ["pareto", "--objectives", "val_loss,params"],
                "compare": ["compare", "--baseline", "a", "--by", "arm"]}


def _sparse_nul(path: Path) -> None:
    with path.open("wb") as file:
        file.truncate(2 << 30)  # 2 GB of NUL bytes, no disk used


def _long_field(path: Path) -> None:
    # 16 MB: sixteen of pyarrow's default 1 MB blocks, and quick to parse on a busy machine
    path.write_text("arm,params,val_loss,note\n" + "a,1e6,3.0," + "x" * (16 << 20) + "\n")


# name: (how to make the CSV, what the one line says)
CSVS = {
    "duplicate-columns": (lambda p: p.write_text("arm,params,val_loss,params\na,1,2,3\n"),
                          "names column 'params' more than once"),
    "header-only": (lambda p: p.write_text("arm,params,val_loss,seed\n"), "the header has no rows under it"),
    "fifo": (os.mkfifo, "is a named pipe"),
    "dev-zero": (lambda p: p.symlink_to("/dev/zero"), "is a device"),
    "folder": (lambda p: p.mkdir(), "is a directory"),
    "missing": (lambda p: None, "does not exist"),
    "million-columns": (lambda p: p.write_text(",".join(f"c{i}" for i in range(10**6)) + "\n1\n"),
                        "the header names 1,000,000 columns"),
    "2gb-of-nul": (_sparse_nul, "is larger than 100,000,000 bytes"),
    "nul-bytes": (lambda p: p.write_bytes(b"arm,params\n\x00\x00\n"), "is a binary file"),
}


@pytest.mark.parametrize("command", list(CSV_COMMANDS))
@pytest.mark.parametrize("case", list(CSVS))
def test_a_hostile_csv_is_one_line_naming_it(case, command, tmp_path):
    make, expect = CSVS[case]
    csv = tmp_path / "rows.csv"
    make(csv)
    code, stderr = run_limited(*CSV_COMMANDS[command], "--from-csv", str(csv))
    assert_one_clean_line(code, stderr, expect=expect, name=str(csv), line_number=False)


def test_a_long_field_is_read_not_refused_for_a_block_size(tmp_path):
    """A field longer than pyarrow's default block once asked to "increase block size", which
    no option can do; the file is read as one block instead."""
    csv = tmp_path / "long.csv"
    _long_field(csv)
    code, stderr = run_limited("fit", "--from-csv", str(csv))
    assert "block size" not in stderr and "Traceback" not in stderr, stderr
    assert code == 2 and "nothing to fit" in stderr  # one row: read, then too few points


# a number that is not finite, wherever a command takes one
NUMBERS = {
    "fit --at N=inf": (["fit", "--store", "STORE", "--at", "N=inf", "--json"], "--at 'N=inf'"),
    "fit --at D=nan": (["fit", "--store", "STORE", "--at", "N=1e9,D=nan"], "--at 'N=1e9,D=nan'"),
    "fit --at C=-inf": (["fit", "--store", "STORE", "--at", "C=-inf"], "--at 'C=-inf'"),
    "pareto --reference nan,nan": (["pareto", "--store", "STORE", "--reference", "nan,nan"],
                                   "--reference 'nan,nan'"),
    "pareto --reference inf,1": (["pareto", "--store", "STORE", "--reference", "inf,1"], "--reference 'inf,1'"),
    "pareto --extrapolate inf": (["pareto", "--store", "STORE", "--extrapolate", "inf"], "--extrapolate inf"),
    "pareto --extrapolate nan": (["pareto", "--store", "STORE", "--extrapolate", "nan"], "--extrapolate nan"),
    "analyze wanda --sparsity nan": (["analyze", "wanda", "t0", "--store", "STORE", "--sparsity", "nan"],
                                     "--sparsity nan"),
    "analyze rho --noise inf": (["analyze", "rho", "t0", "--store", "STORE", "--noise", "inf"], "--noise inf"),
    "analyze exit --lr -inf": (["analyze", "exit", "t0", "--store", "STORE", "--lr", "-inf"], "--lr -inf"),
    "analyze exit --thresholds nan": (["analyze", "exit", "t0", "--store", "STORE", "--thresholds", "0.5,nan"],
                                      "every threshold must be in (0, 1]"),
    "plan --set lr=.nan": (["plan", "STUDY", "--set", "recipe.weight_decay=.nan"], "Input should be a finite number"),
    "plan --set targets=[.inf]": (["plan", "STUDY", "--set", "budget.targets=[.inf]"],
                                  "Input should be a finite number"),
    "plan --set tolerance=.inf": (["plan", "STUDY", "--set", "budget.tolerance=.inf"],
                                  "Input should be a finite number"),
}


@pytest.fixture(scope="module")
def good_store(tmp_path_factory) -> Path:
    return write_store(tmp_path_factory.mktemp("numbers") / "s.duckdb")


def _args(args: list[str], store: Path, study: Path) -> list[str]:
    return [{"STORE": str(store), "STUDY": str(study)}.get(a, a) for a in args]


@pytest.mark.parametrize("case", list(NUMBERS))
def test_a_number_that_is_not_finite_is_refused(case, good_store, tiny_study):
    args, expect = NUMBERS[case]
    code, stderr = run_limited(*_args(args, good_store, tiny_study))
    assert_one_clean_line(code, stderr, expect=expect, name="", line_number=False)
    assert "finite" in stderr or "thresholds" in case, stderr


def registered_commands() -> dict[str, object]:
    """Every command's function as the app registered it (``analyze rho`` for a sub-command)."""
    from archsearch.cli_analyze import analyze_app

    out = {}
    for prefix, typer_app in (("", app), ("analyze ", analyze_app)):
        for command in typer_app.registered_commands:
            name = command.name or command.callback.__name__.replace("_", "-")
            out[prefix + name] = command.callback
    return out


def _takes_a_float(function) -> bool:
    import typing

    original = inspect.unwrap(function)
    hints = typing.get_type_hints(original, include_extras=True)

    def floats(hint) -> bool:
        return hint is float or any(floats(inner) for inner in typing.get_args(hint))

    return any(floats(hint) for name, hint in hints.items() if name != "return")


def test_every_command_that_takes_a_number_refuses_nan_and_infinity():
    """Each command with a float option runs inside ``user_errors``, which refuses a NaN or an
    infinity given to any of them (the analyze and fit cases above show the line)."""
    commands = registered_commands()
    takes = {name for name, function in commands.items() if _takes_a_float(function)}
    assert {"fit", "pareto", "analyze wanda", "analyze exit"} <= takes
    for name in takes:
        wrappers = []
        function = commands[name]
        while function is not None:
            wrappers.append(function.__code__.co_qualname)  # functools.wraps copies __qualname__, not this
            function = getattr(function, "__wrapped__", None)
        assert any(w.startswith("user_errors") for w in wrappers), f"`archsearch {name}` is not in user_errors"


@pytest.mark.parametrize("value", ["&a [0, *a]", "&m {x: 1, y: *m}", "&m {x: 1, <<: *m}"])
def test_a_set_value_that_contains_itself_is_one_line(value, tiny_study):
    code, stderr = run_limited("plan", str(tiny_study), "--set", f"seeds={value}")
    line = assert_one_clean_line(code, stderr, expect="itself", name=f"--set seeds={value}", line_number=False)
    assert "RecursionError" not in line


# strict JSON: every command with --json, run on inputs whose results hold NaN where JSON has none


def _reject(constant: str):
    raise ValueError(f"not JSON: {constant}")


def strict_loads(text: str):
    """JSON as the standard has it: NaN, Infinity and -Infinity are errors."""
    return json.loads(text, parse_constant=_reject)


def commands_with_json() -> set[str]:
    """Every command (``analyze rho`` for a sub-command) that has a ``--json`` option."""
    found, root = set(), typer.main.get_command(app)
    stack = [((), root)]
    while stack:
        prefix, command = stack.pop()
        if hasattr(command, "commands"):  # a group (typer's own, not a click.Group)
            stack += [((*prefix, name), sub) for name, sub in command.commands.items()]
        elif any("--json" in getattr(p, "opts", ()) for p in command.params):
            found.add(" ".join(prefix))
    return found


CALIB = ["--batches", "2", "--batch-size", "2"]
JSON_CASES = {
    "plan": ["plan", "STUDY", "--json"],
    "status": ["status", "--store", "NANS", "--json"],
    "ls": ["ls", "--store", "NANS", "--json"],
    "fit": ["fit", "--store", "NANS", "--at", "N=1e9", "--json"],
    "fit-csv": ["fit", "--from-csv", "CSV", "--json"],  # a single point: every statistic undefined
    "pareto": ["pareto", "--store", "NANS", "--json"],
    "pareto-extrapolated": ["pareto", "--store", "NANS", "--extrapolate", "1e9", "--json"],
    "compare": ["compare", "--store", "NANS", "--baseline", "transformer", "--by", "family", "--pool", "--json"],
    "compare-csv": ["compare", "--from-csv", "CSV", "--baseline", "a", "--by", "arm", "--json"],  # one seed
    "bench": ["bench", "STUDY", "--trial", "0", "--rounds", "1", "--no-hf", "--kernels", "off", "--json"],
    "analyze rho": ["analyze", "rho", "stack", "--store", "TRAINED", *CALIB, "--json"],
    "analyze prune": ["analyze", "prune", "stack", "--store", "TRAINED", *CALIB, "--json"],
    "analyze wanda": ["analyze", "wanda", "stack", "--store", "TRAINED", "--sparsity", "0.5", *CALIB, "--json"],
    "analyze exit": ["analyze", "exit", "looped", "--store", "TRAINED", "--thresholds", "0.5,1.0",
                     "--adapt-steps", "1", *CALIB, "--json"],
    "analyze probe": ["analyze", "probe", "stack", "--store", "TRAINED", "--state", "hidden:0",
                      "--target", "lag:0", *CALIB, "--json"],
}
# status --job needs a Ray job server; its output is the same strict_json of strings
NEEDS_A_CLUSTER = {"status", "ls"}


def test_every_command_with_json_is_checked():
    cases = {name.split("-")[0] for name in JSON_CASES}
    found = commands_with_json()
    assert {"plan", "fit", "analyze rho", "bench"} <= found  # the walk finds commands and sub-commands
    assert found <= cases | NEEDS_A_CLUSTER, found - cases


@pytest.fixture(scope="module")
def trained_store(tmp_path_factory) -> Path:
    from tests.test_analyze_cli import LOOPED, STACK, trained

    folder = tmp_path_factory.mktemp("trained")
    corpus = folder / "corpus"
    corpus.mkdir()
    words = "the quick brown fox jumps over the lazy dog while a small model learns to count".split()
    for i in range(4):
        (corpus / f"doc{i}.txt").write_text(" ".join(words[(i + j) % len(words)] for j in range(300)))
    path = folder / "s.duckdb"
    trained(path, STACK, "stack", corpus)
    trained(path, LOOPED, "looped", corpus)
    return path


@pytest.fixture(scope="module")
def nan_store(tmp_path_factory) -> Path:
    """A store another tool wrote NaN and infinities into (DuckDB keeps them; archsearch writes NULL)."""
    import duckdb

    path = write_store(tmp_path_factory.mktemp("nans") / "s.duckdb")
    con = duckdb.connect(str(path))
    con.execute("UPDATE trials SET train_loss = 'nan'::DOUBLE, tokens_per_s = 'inf'::DOUBLE "
                "WHERE trial_id IN ('t0', 't3')")
    con.execute("UPDATE trials SET val_loss = 'nan'::DOUBLE WHERE trial_id = 't5'")
    con.close()
    return path


@pytest.mark.parametrize("case", list(JSON_CASES))
def test_json_output_is_strict_json(case, nan_store, tiny_study, tmp_path, request):
    from typer.testing import CliRunner

    csv = tmp_path / "one.csv"
    csv.write_text("arm,seed,params,val_loss\na,0,1e6,3.0\nb,0,2e6,2.9\n")
    swap = {"NANS": str(nan_store), "STUDY": str(tiny_study), "CSV": str(csv)}
    if "TRAINED" in JSON_CASES[case]:
        swap["TRAINED"] = str(request.getfixturevalue("trained_store"))
    result = CliRunner().invoke(app, [swap.get(a, a) for a in JSON_CASES[case]])
    if case.endswith("-csv") and result.exit_code == 2:  # refused in one line: no JSON to check
        assert result.output.startswith("error: ") and result.output.count("\n") == 1, result.output
        return
    assert result.exit_code == 0, result.output
    strict_loads(result.stdout)


def test_the_guide_states_the_csv_limits_the_code_holds():
    from archsearch.analysis import tables

    text = (Path(__file__).resolve().parents[1] / "docs" / "guide.md").read_text()
    for value in (tables.MAX_CSV_BYTES, tables.MAX_CSV_COLUMNS):
        assert f"{value:,}" in text, f"docs/guide.md does not give the CSV limit {value:,}"


# outputs: a named pipe no process reads would block the write for ever; a socket cannot be written
OUTPUTS = {
    "report": (["report", "-o", "OUT", "--store", "STORE"], "the report"),
    "report-png": (["report", "--png", "OUT", "--store", "STORE"], "PNG files to"),
    "export": (["export", "--parquet", "DIR", "--store", "STORE"], "Parquet files to"),
    "run-report": (["run", "STUDY", "--store", "NEW", "--report", "OUT", "--no-progress"], "the report"),
}


@pytest.mark.parametrize("kind", ["fifo", "socket"])
@pytest.mark.parametrize("case", list(OUTPUTS))
def test_an_output_that_would_block_is_refused(case, kind, good_store, tiny_study, tmp_path):
    import socket

    args, what = OUTPUTS[case]
    odd = tmp_path / ("parquet" if case == "export" else "out.html")
    if case == "export":
        odd.mkdir()
        odd = odd / "studies.parquet"  # one of the files export writes
    if kind == "fifo":
        os.mkfifo(odd)
    else:
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(odd))
        server.close()
    swap = {"OUT": str(odd), "DIR": str(odd.parent), "STORE": str(good_store), "STUDY": str(tiny_study),
            "NEW": str(tmp_path / "new.duckdb")}
    code, stderr = run_limited(*[swap.get(a, a) for a in args])
    expect = "is a named pipe no process reads" if kind == "fifo" else "is a socket"
    line = assert_one_clean_line(code, stderr, expect=expect, name=str(odd), line_number=False)
    assert f"cannot write {what}" in line and "choose another path" in line
    assert not (tmp_path / "new.duckdb.checkpoints").exists()  # run refused before training anything


def test_a_device_or_a_read_pipe_is_written_to(good_store, tmp_path):
    """What a user pipes or discards on purpose is not refused: /dev/null, and a pipe with a reader."""
    code, stderr = run_limited("report", "-o", "/dev/null", "--store", str(good_store))
    assert code == 0, stderr
