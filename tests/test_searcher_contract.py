"""The one contract every search keeps with the driver (``search._base.Searcher``):
driven to its end as the driver drives it, each has the members the driver reads
(``records``, ``ladder``, ``pruned``, ``rungs``, ``notes``), with what they must hold."""

from __future__ import annotations

import pytest

import archsearch as A
from archsearch.search import GridSearch, HalvingSearch, Searcher, make_searcher, parse_objectives
from tests import test_halving, test_ladder, test_search
from tests.conftest import TINY_SPACE, tiny_study_text


def grid(tmp_path) -> Searcher:
    (tmp_path / "space.yaml").write_text(TINY_SPACE)
    (tmp_path / "study.yaml").write_text(tiny_study_text(corpus=tmp_path))
    return make_searcher(A.load_study(tmp_path / "study.yaml"), store=str(tmp_path / "s.duckdb"), known={})


def sampled(tmp_path) -> Searcher:
    return make_searcher(A.load_study(test_search.write_study(tmp_path, sampler="random", trials=4)),
                         store=str(tmp_path / "s.duckdb"), known={})


def probe(tmp_path) -> Searcher:
    return make_searcher(A.load_study(test_ladder.write_study(tmp_path)), store=str(tmp_path / "s"), known={})


def halving(tmp_path) -> Searcher:
    trials = [test_halving.FakeTrial(i, final) for i, final in enumerate([3.0, 1.0, 5.0, 4.0, 2.0, 6.0])]
    return HalvingSearch(GridSearch(trials), objectives=parse_objectives(["val_loss:min"]), rungs=2, eta=3,
                         kind="asha")


def result(job) -> dict:
    """A result every search can score: the halving fakes' curve, or the sampled search's fake."""
    if isinstance(job.trial, test_halving.FakeTrial):
        return test_halving.curve(job.trial, job.stop_at or 1.0)
    if job.trial.axes.get("fidelity") == "probe" or "fidelity" in str(job.trial.data):
        return test_ladder.fake(job)
    return test_search.fake_result(job.trial)


def drive(search: Searcher) -> None:
    """Two jobs in flight, each told as it ends, until the search has nothing more."""
    running = []
    while True:
        running += search.ask(2 - len(running))
        if not running:
            return
        job = running.pop(0)
        search.tell(job, result(job))


@pytest.mark.parametrize("make", [grid, sampled, probe, halving], ids=["grid", "sampled", "probe", "halving"])
def test_every_search_keeps_the_members_the_driver_reads(tmp_path, make):
    search = make(tmp_path)
    assert search.records == [] and search.pruned == [] and search.ladder is None and search.notes == []
    drive(search)
    assert search.exhausted
    assert isinstance(search.rungs, int) and search.rungs >= 1
    assert isinstance(search.records, list) and all("state" in record for record in search.records)
    assert (len(search.records) == 4) == (make is sampled)  # one record per finished proposal
    assert (search.ladder is not None) == (make is probe)
    assert all(0 <= rung < search.rungs - 1 for _, rung in search.pruned)
    assert (len(search.pruned) > 0) == (make is halving)
    assert all(isinstance(note, str) for note in search.notes)
    search.records.clear()  # the driver empties the list it wrote; the search keeps that list
    assert search.records == []
