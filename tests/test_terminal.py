"""What the command line prints (archsearch/terminal.py and the terminal_* modules), without Ray: the
plan table, per-layer tables, the Pareto front, the run summary and the
status tables, at 80 and 120 columns, with hostile values in them."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

import archsearch as A
from archsearch import terminal, terminal_plan, terminal_results, terminal_store
from archsearch.execute.driver import RunSummary

HOSTILE_SPACE = """\
name: tiny
axes:
  family: transformer
  num_layers: 2
  taper:
    shape: [uniform, cosine]
derived:
  note: "'[/bold]'"
  colour: "'\\x1b[31mred :thumbs_up:'"
model:
  head_dim: 8
"""


def _study(folder: Path, *, space: str, targets: str = "[6000, 9000]") -> Path:
    (folder / "space.yaml").write_text(space)
    path = folder / "study.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: tiny
        space: space.yaml
        budget: {{targets: {targets}, tolerance: 0.02}}
        data: {{kind: task, name: mqar, params: {{vocab_size: 64, seq_len: 32, num_pairs: 4}}}}
        recipe: {{steps: 2}}
        """))
    return path


@pytest.fixture
def trials(tmp_path):
    """Two taper shapes x two targets, with a derived markup string and an ANSI escape in every trial."""
    return A.plan(A.load_study(_study(tmp_path, space=HOSTILE_SPACE)))


@pytest.fixture
def store(tmp_path, trials):
    """A store holding ``trials`` as a study: three completed, one failed (no Ray: results written directly)."""
    path = tmp_path / "s.duckdb"
    with A.open_store(path) as db:
        db.add_study(name="tiny", path="study.yaml", config={})
        db.add_trials("tiny", [t.to_dict() for t in trials])
        for i, t in enumerate(trials[:3]):
            db.mark_running(t.trial_id)
            db.finish(t.trial_id, dict(train_loss=3.0 - i / 10, val_loss=3.1 - i / 10, val_accuracy=0.1, steps=2,
                                       tokens=128, wall_time_s=1.5, tokens_per_s=[5738.4, 12742.0, 987.6][i],
                                       curve=[]))
        db.mark_running(trials[3].trial_id)
        db.fail(trials[3].trial_id, "ValueError: [red]boom\x1b[2J")
    return path


def printed(capsys, monkeypatch, width: int, show, *args, **kwargs) -> str:
    monkeypatch.setenv("COLUMNS", str(width))
    show(*args, **kwargs)
    return capsys.readouterr().out


def header(out: str, title: str) -> list[str]:
    """The words of the header of the table titled ``title`` (the lines
    between the title and the rule; a dotted name spans two of them)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if title in line) + 1
    rule = next(i for i in range(start, len(lines)) if lines[i].startswith("─"))
    return " ".join(lines[start:rule]).split()


def _fits(out: str, width: int) -> None:
    assert out.strip()
    # (a path is printed whole, for the terminal to wrap)
    assert max(len(line) for line in out.splitlines() if not line.startswith(("studies in /", "report: /"))) <= width
    assert "…" not in out  # nothing cut


@pytest.mark.parametrize("width", [80, 120])
def test_plan_table_is_whole_at_80_and_120_columns(trials, capsys, monkeypatch, width):
    """Mutation: the old fixed 240-column console and its 13 columns fail here."""
    out = printed(capsys, monkeypatch, width, terminal_plan.plan_table, trials)
    _fits(out, width)
    for t in trials:
        row = next(line for line in out.splitlines() if line.startswith(t.trial_id[:8] + " "))
        assert t.axes["taper.shape"] in row and f"{t.params:,}" in row and f"{t.match_error:+.2%}" in row
    # axes that are the same in every trial are said once, not repeated per row
    assert "same in every row: family=transformer, num_layers=2" in " ".join(out.split())
    words = header(out, "planned trials")
    assert words == ["taper.", "taper.", "trial", "shape", "ratio", "params", "error", "FLOPs/token", "memory"]


def test_wide_plan_table_has_every_column_at_full_width(trials, capsys, monkeypatch):
    out = printed(capsys, monkeypatch, 80, terminal_plan.plan_table, trials, wide=True)
    words = header(out, "planned trials")
    for name in ("family", "num_layers", "taper.shape", "seed", "target", "achieved", "d_model", "MLP", "state"):
        assert name in words
    widths = ",".join(map(str, trials[0].spec.mlp_widths))
    assert widths in out and "…" not in out


def test_layers_show_each_layer_of_each_trial(trials, capsys, monkeypatch):
    from archsearch.arch.structures.stack import layer_params

    out = printed(capsys, monkeypatch, 80, terminal_plan.plan_table, trials, layers=True)
    for t in trials:
        assert f"trial {t.trial_id}: d_model={t.spec.d_model}" in out
    first = trials[0]
    section = out.split(f"trial {first.trial_id}: d_model")[1].split("trial ")[0]
    rows = [line.split() for line in section.splitlines() if line.strip()[:1].isdigit()]
    assert [int(r[0]) for r in rows] == list(range(first.spec.num_layers))
    assert [int(r[3]) for r in rows] == list(first.spec.mlp_widths)
    assert [int(r[4].replace(",", "")) for r in rows] == [layer_params(first.spec, layer)
                                                          for layer in first.spec.layers]


def test_markup_emoji_and_escapes_in_values_print_literally(trials, store, capsys, monkeypatch):
    """A derived '[/bold]' crashed plan, status and pareto (rich read it as
    markup); an ESC reached the terminal. Mutation: a console with markup on fails."""
    front = [{"trial_id": "t1", "axes": trials[0].axes, "val_loss": 1.0},
             {"trial_id": "t2", "axes": trials[2].axes, "val_loss": 2.0}]
    for show, args in ((terminal_plan.plan_table, (trials,)), (terminal_results.front_table, (front, ["val_loss"]))):
        out = printed(capsys, monkeypatch, 120, show, *args)
        assert "note=[/bold]" in out
        assert "\x1b" not in out and "colour=\\x1b[31mred :thumbs_up:" in " ".join(out.split())
    with A.open_store(store, read_only=True) as db:
        out = printed(capsys, monkeypatch, 120, terminal_store.status_tables, db, study=None, as_json=False)
    assert "ValueError: [red]boom\\x1b[2J" in out and "\x1b" not in out


@pytest.mark.parametrize("width", [80, 120])
def test_status_tables_are_whole_and_name_the_failure(store, trials, capsys, monkeypatch, width):
    with A.open_store(store, read_only=True) as db:
        out = printed(capsys, monkeypatch, width, terminal_store.status_tables, db, study="tiny", as_json=False)
    _fits(out, width)
    lines = out.splitlines()
    study_row = next(line for line in lines if line.startswith("tiny"))
    assert study_row.split()[:4] == ["tiny", "4", "3", "1"]
    # with ids by their first 8 characters the generalisation gap (val_loss - train_loss) fits at 80
    assert header(out, "trials of tiny") == ["taper.", "taper.", "trial", "shape", "ratio", "params", "status",
                                             "val_loss", "gap", "tokens/s"]
    assert "left out" not in out
    gap = ["gap"]
    for i, t in enumerate(trials):
        row = next(line for line in lines if line.startswith(t.trial_id[:8] + " ")).split()
        assert row[1:4] == [t.axes["taper.shape"], str(t.axes["taper.ratio"]), f"{t.params:,}"]
        if gap and i < 3:
            assert row[6] == "0.1000"  # val_loss 3.1 - i/10 over train_loss 3.0 - i/10
    # one format for every throughput: thousands separators from 1,000 up
    assert "5,738" in out and "12,742" in out and "987.6" in out
    assert f"trial {trials[3].trial_id} failed: ValueError: [red]boom" in out


def test_status_json_is_the_store(store, capsys):
    with A.open_store(store, read_only=True) as db:
        terminal_store.status_tables(db, study=None, as_json=True)
    data = json.loads(capsys.readouterr().out)
    assert [s["name"] for s in data["studies"]] == ["tiny"]
    assert sorted(t["status"] for t in data["trials"]) == ["completed"] * 3 + ["failed"]
    # objects, not JSON text inside JSON
    first = data["trials"][0]
    assert first["axes"]["family"] == "transformer" and first["spec"]["family"] == "transformer"
    assert isinstance(first["recipe"], dict) and first["data"]["kind"] == "task"


def test_front_table_lists_only_the_axes_that_differ(capsys, monkeypatch):
    front = [{"trial_id": "a", "axes": {"family": "gdn", "loops": 2}, "val_loss": 2.5, "params": 12345},
             {"trial_id": "b", "axes": {"family": "gdn", "loops": 4}, "val_loss": 2.25, "params": 54321}]
    out = printed(capsys, monkeypatch, 80, terminal_results.front_table, front, ["val_loss", "params"])
    _fits(out, 80)
    assert header(out, "Pareto front") == ["trial", "loops", "val_loss", "params"]
    assert next(line for line in out.splitlines() if line.startswith("b")).split() == ["b", "4", "2.250", "54,321"]
    assert "same in every row: family=gdn" in out


def test_run_summary_names_the_best_trial_and_writes_the_report(store, trials, tmp_path, capsys, monkeypatch):
    summary = RunSummary(study="tiny", planned=4, skipped=1, completed=2, failed=1, wall_time_s=1234.4)
    report = tmp_path / "out" / "tiny.html"
    out = printed(capsys, monkeypatch, 80, terminal_store.run_summary, summary, store=store, report=report)
    _fits(out, 80)
    assert "tiny: 4 trials planned, 1 already done, 2 trained, 1 failed in 1,234s" in out
    best = trials[2]  # the lowest val_loss written by the fixture
    assert f"best trial {best.trial_id}: val_loss 2.9000 at {best.params:,} non-embedding params" in out
    assert "Pareto front (val_loss, params)" in out
    assert f"report: {report}" in out and report.read_text().lower().startswith("<!doctype html>")


def test_numbers_have_one_format():
    assert [terminal._fmt(v) for v in (5738.4, 12742, 987.64, 1.79, None, True, 1e12)] == [
        "5,738", "12,742", "987.6", "1.790", "-", "yes", "1,000,000,000,000"]
    assert [terminal._axis(v) for v in (3.0, 1e-05, 4, "cosine")] == ["3.0", "1e-05", "4", "cosine"]


def test_the_run_summary_front_names_both_baselines_and_shows_a_shared_training_once(tmp_path, capsys, monkeypatch):
    """A looped study under both protocols: the front's baselines are named by
    protocol and model, not both ``baseline``; the iso-param baseline of loops
    2 and 4 is one model trained once (``same_as``), so it is one row that
    names both arms, not two identical rows. Fails on the old table, which
    showed ``baseline`` three times and the twin's row twice."""
    from tests.dashboard_support import result, spec, trial

    store = tmp_path / "loop.duckdb"
    arms = [("flop-2", {"loops": 2, "arm": "baseline"}, "iso_flop", [24] * 4, 40_000, 2.4, None),
            ("looped-2", {"loops": 2, "arm": "looped"}, "params", [32] * 2, 20_000, 2.5, None),
            ("param-2", {"loops": 2, "arm": "baseline"}, "iso_param", [40] * 2, 10_000, 2.7, None),
            ("param-4", {"loops": 4, "arm": "baseline"}, "iso_param", [40] * 2, 10_000, 2.7, "param-2")]
    rows = []
    for trial_id, axes, match, widths, params, _, twin in arms:
        row = trial(trial_id, family="looped", axes=axes, params=params)
        rows.append(dict(row, match=match, spec=spec("hybrid", widths), same_as=twin))
    with A.open_store(store) as db:
        db.add_study(name="loop", path="loop.yaml", config={})
        db.add_trials("loop", rows)
        for trial_id, *_, loss, twin in arms:
            db.share(trial_id, twin) if twin else db.finish(trial_id, result(loss))
    summary = RunSummary(study="loop", planned=4, skipped=0, completed=3, failed=0, wall_time_s=1.0, shared=1)
    out = printed(capsys, monkeypatch, 120, terminal_store.run_summary, summary, store=store, report=tmp_path / "r.html")
    lines = out.splitlines()
    front = lines[next(i for i, line in enumerate(lines) if "Pareto front" in line):]
    assert any(line.startswith("flop-2 ") and "baseline (iso-FLOP: 4-layer stack)" in line for line in front)
    assert any(line.startswith("param-2 (+1) ") and "baseline (iso-param: 2-layer stack)" in line for line in front)
    assert not any(line.startswith("param-4") for line in front)
    assert ("param-2 (+1): one training gives the result of 2 arms (twins: same spec, data, recipe and seed): "
            "loops=2, baseline (iso-param: 2-layer stack); loops=4, baseline (iso-param: 2-layer stack)"
            ) in " ".join(out.split())


@pytest.mark.parametrize("width", [80, 120])
def test_status_says_where_each_running_trial_is(tmp_path, trials, capsys, monkeypatch, width):
    """A running trial's latest report under the table (its step of how many, loss, speed, ETA and how
    old the report is), whole at 80 columns; a trial that stopped shows none, whatever it reported."""
    path = tmp_path / "running.duckdb"
    report = dict(step=120, total_steps=400, tokens=120 * 64, total_tokens=400 * 64, train_loss=2.31,
                  tokens_per_s=5120.0, elapsed_s=2.0)
    with A.open_store(path) as db:
        db.add_study(name="tiny", path="study.yaml", config={})
        db.add_trials("tiny", [t.to_dict() for t in trials])
        db.mark_running(trials[0].trial_id)
        db.mark_running(trials[1].trial_id)
        db.record_progress({trials[0].trial_id: report, trials[1].trial_id: report})
        db.fail(trials[1].trial_id, "ValueError: gone")
    from archsearch.store import RunLock

    with RunLock(path, study="tiny"), A.open_store(path, read_only=True) as db:  # its run is alive
        out = printed(capsys, monkeypatch, width, terminal_store.status_tables, db, study="tiny", as_json=False)
        terminal_store.status_tables(db, study="tiny", as_json=True)
    with A.open_store(path, read_only=True) as db:  # its run has gone: the trial was interrupted
        assert db.progress("tiny") == {}
    _fits(out, width)
    # 280 steps of 64 tokens at 5120 tokens/s: 3.5 s
    assert f"  trial {trials[0].trial_id[:8]}: step 120/400, loss 2.310, 5.12k tokens/s, ETA 4 s (reported" in out
    assert trials[1].trial_id[:8] + ":" not in out
    objects = {t["trial_id"]: t for t in json.loads(capsys.readouterr().out)["trials"]}
    assert objects[trials[0].trial_id]["progress"]["step"] == 120 and "progress" not in objects[trials[1].trial_id]


def test_slow_work_says_what_it_does_and_quick_work_passes_in_silence(capsys):
    import time

    with terminal.doing("fitting everything", after_s=60):
        pass
    assert capsys.readouterr().err == ""
    with terminal.doing("fitting everything", after_s=0.0):
        deadline = time.monotonic() + 30
        while "fitting everything ..." not in capsys.readouterr().err:
            assert time.monotonic() < deadline, "no line said what was being done"
            time.sleep(0.01)
