"""The HTML report's trials table, on a store written by hand (no Ray):
which trials it lists, in which order, what each row says, which rows it
marks on the Pareto front, and that of a learning-rate sweep only the best
run is shown."""

from __future__ import annotations

from html.parser import HTMLParser

from archsearch_dashboards.report import write_report

import archsearch as A


class _Table(HTMLParser):
    """The rows of the page's one <table>, each a list of cell texts."""

    def __init__(self):
        super().__init__()
        self.rows: list[list[str]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append("".join(self._cell))
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def trials_table(page: str) -> list[dict[str, str]]:
    """The report's trials table as one dict per row, keyed by the header."""
    parser = _Table()
    parser.feed(page)
    head, *rows = parser.rows
    return [dict(zip(head, row)) for row in rows]


def on_front_by_hand(rows: list[dict]) -> set[str]:
    """Trials no other trial beats on both val_loss and params (lower is better)."""
    def beats(a, b):
        return (a["val_loss"] <= b["val_loss"] and a["params"] <= b["params"]
                and (a["val_loss"], a["params"]) != (b["val_loss"], b["params"]))

    return {b["trial_id"] for b in rows if not any(beats(a, b) for a in rows)}


def _trial(trial_id: str, *, params: int, shape: str, sweep_group: str | None = None) -> dict:
    spec = {"family": "transformer", "layers": [{"mlp_width": 48}, {"mlp_width": 16}]}
    return dict(trial_id=trial_id, spec=spec, axes={"taper.shape": shape}, seed=0, match="params",
                target=float(params), params=params, total_params=params + 4096, flops_per_token=6.0 * params,
                match_error=0.0025, d_model=16, num_layers=2, recipe={"steps": 1}, data={"kind": "text"},
                sweep_group=sweep_group)


def _result(val_loss: float) -> dict:
    return dict(train_loss=val_loss - 0.1, val_loss=val_loss, val_accuracy=0.3, steps=10, tokens=640,
                wall_time_s=1.0, tokens_per_s=640.0,
                curve=[dict(step=10, tokens=640, train_loss=val_loss - 0.1, val_loss=val_loss, val_accuracy=0.3,
                            lr=1e-3)])


def test_report_lists_completed_trials_marks_the_front_and_keeps_each_sweeps_best(tmp_path):
    """Four trials count: three plain ones and the best of a three-run lr sweep;
    the other two sweep runs and a failed trial appear nowhere on the page.
    Rows come best first, with the store's params, match error, widths and
    loss; "yes" marks exactly the hand-computed front. Fails on the mutations
    that drop the sweep-best filter that ``completed_rows`` reads through
    (``analysis.completed_trials``: ``counted`` left out of its filter) and
    that mark every row on the front in ``_table``."""
    plain = {"small": (1000, 3.0, "uniform"), "large": (2000, 2.5, "cosine"), "dominated": (3000, 2.7, "reverse")}
    sweep = {"sweep-lr-lo": 2.8, "sweep-lr-mid": 2.6, "sweep-lr-hi": 2.9}
    with A.open_store(tmp_path / "s.duckdb") as store:
        store.add_study(name="s", path="s.yaml", config={})
        store.add_trials("s", [_trial(name, params=p, shape=shape) for name, (p, _, shape) in plain.items()]
                         + [_trial(name, params=1500, shape="cosine", sweep_group="g") for name in sweep]
                         + [_trial("broken", params=1200, shape="uniform")])
        for name, (_, loss, _) in plain.items():
            store.finish(name, _result(loss))
        for name, loss in sweep.items():
            store.finish(name, _result(loss))
        store.fail("broken", "RuntimeError: out of memory")
        page = write_report(store, tmp_path / "r.html", study="s").read_text()

    table = trials_table(page)
    assert [row["trial"] for row in table] == ["large", "sweep-lr-mid", "dominated", "small"]
    for hidden in ("sweep-lr-lo", "sweep-lr-hi", "broken"):
        assert hidden not in page  # not in the table, nor in any figure's data
    losses = {"sweep-lr-mid": 2.6, **{name: loss for name, (_, loss, _) in plain.items()}}
    params = {"sweep-lr-mid": 1500, **{name: p for name, (p, _, _) in plain.items()}}
    for row in table:
        assert row["val loss"] == f"{losses[row['trial']]:.4f}" and row["params"] == f"{params[row['trial']]:,}"
        assert row["match error"] == "+0.25%" and row["MLP widths"] == "[48, 16]" and row["d_model"] == "16"
    expected = on_front_by_hand([dict(trial_id=name, val_loss=losses[name], params=params[name]) for name in losses])
    assert expected == {"small", "large", "sweep-lr-mid"}
    assert {row["trial"] for row in table if row["front"] == "yes"} == expected
    assert "4 completed trials" in page
