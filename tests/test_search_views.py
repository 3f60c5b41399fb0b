"""What a sampled search learnt, as optuna-dashboard shows it: the history of each proposal's
value with the best so far, and each axis' importance (PED-ANOVA), in the report of a study
with `search:`; a grid's report has neither."""

from __future__ import annotations

import numpy as np

import archsearch as A
from archsearch.search.history import history, importance
from archsearch_dashboards.report import report_figures
from tests.dashboard_support import write_store


def proposals(count: int = 24, seed: int = 0) -> list[dict]:
    """Proposals whose loss is set by num_layers alone (taper.shape is noise-free filler)."""
    rng = np.random.default_rng(seed)
    out = []
    for number in range(count):
        layers, shape = int(rng.integers(2, 9)), str(rng.choice(["uniform", "cosine", "reverse"]))
        out.append(dict(number=number, point={"family": "transformer", "num_layers": layers, "taper.shape": shape},
                        trial_ids=[f"t{number}"], objectives=["val_loss:min", "params:min"],
                        values=[3.0 - 0.1 * layers + 0.001 * rng.standard_normal(), 1000.0 * layers],
                        state="completed"))
    out.append(dict(number=count, point={"num_layers": 3}, trial_ids=["failed"], objectives=["val_loss:min"],
                    values=None, state="failed"))
    return out


def test_the_history_is_each_value_and_the_best_so_far_in_the_order_asked():
    rows = proposals()
    past = history(rows)
    loss = past["val_loss:min"]
    assert loss["number"] == list(range(24))  # the failed proposal has no value
    assert loss["best"] == [min(loss["value"][:k + 1]) for k in range(24)]
    assert past["params:min"]["best"][-1] == min(past["params:min"]["value"])


def test_the_axis_that_sets_the_loss_is_the_important_one():
    found = importance(proposals())
    assert found["val_loss:min"]["num_layers"] > 0.8 > found["val_loss:min"].get("taper.shape", 0.0)
    assert importance(proposals(count=4)) == {}  # too few proposals to have a best tenth


def test_the_report_of_a_sampled_study_shows_history_and_importance(tmp_path):
    store = tmp_path / "s.duckdb"
    write_store(store)
    with A.open_store(store) as db:
        plain = report_figures(db, "s")
        db.record_proposals("s", proposals())
        sampled = report_figures(db, "s")
    assert "history" not in plain and "importance" not in plain
    history_fig, importance_fig = sampled["history"], sampled["importance"]
    assert list(history_fig.data[1].y) == history(proposals())["val_loss:min"]["best"]
    assert list(importance_fig.data[0].y)[0] == "num_layers"  # most important on top
    assert "also searched: params:min" in history_fig.layout.title.text
