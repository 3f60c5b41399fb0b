"""Multi-fidelity search on known curves: which trials reach which rung,
when promotion may happen, and that a trial stopped at a rung and continued
later trains exactly like an uninterrupted run."""

from __future__ import annotations

import itertools
import random
import textwrap

import pytest

import archsearch as A
from archsearch.search import GridSearch, HalvingSearch, Job, parse_objectives, rank_order
from archsearch.search.halving import _hyperband_brackets


class FakeTrial:
    """Enough of a PlannedTrial for the search: an id, a final loss and a speed."""

    def __init__(self, index: int, final: float, speed: float = 1.0):
        self.trial_id, self.final, self.speed = f"t{index}", final, speed

    def to_dict(self) -> dict:
        return {"trial_id": self.trial_id, "tokens_per_s": self.speed}


def curve(trial: FakeTrial, fraction: float) -> dict:
    """Loss falls with tokens towards the trial's final value; order kept at every rung."""
    return dict(val_loss=trial.final + 1.0 / fraction, tokens=int(1000 * fraction))


def halving(trials, *, kind="asha", rungs=3, eta=3, objectives=("val_loss:min",)):
    return HalvingSearch(GridSearch(trials), objectives=parse_objectives(list(objectives)), rungs=rungs, eta=eta,
                         kind=kind)


def drive(search, width: int):
    """Jobs run ``width`` at a time, finishing in the order they started."""
    log, running = [], []
    while True:
        running += search.ask(width - len(running))
        if not running:
            return log
        job = running.pop(0)
        log.append((job.trial.trial_id, job.rung, job.stop_at))
        search.tell(job, curve(job.trial, job.stop_at or 1.0))


def test_asha_trains_the_best_to_the_end_and_prunes_the_rest():
    finals = [3.0, 1.0, 5.0, 4.0, 2.0, 6.0, 7.0, 8.0, 9.0]
    search = halving([FakeTrial(i, f) for i, f in enumerate(finals)])
    log = drive(search, width=1)
    by_rung = {r: {t for t, rung, _ in log if rung == r} for r in range(3)}
    assert len(by_rung[0]) == 9 and len(by_rung[1]) == 3 and by_rung[2] == {"t1"}
    assert {"t1", "t4"} <= by_rung[1]  # the two best at rung 0 always earn the next rung
    assert {t.trial_id for t, _ in search.pruned} == {f"t{i}" for i in range(9)} - {"t1"}
    assert search.exhausted and all(stop in (1 / 9, 1 / 3, None) for _, _, stop in log)
    tokens = sum(1000 * (stop or 1.0) for _, _, stop in log)
    assert tokens < 0.4 * 9 * 1000  # what it pays: under 40% of training every trial to the end


@pytest.mark.parametrize("kind", ["asha", "halving"])
def test_a_search_restored_from_its_rungs_ends_as_an_uninterrupted_one(kind):
    """A driver killed after 7 results: a new search built from the rungs the
    store kept promotes and prunes exactly as the uninterrupted run did."""
    finals = [3.0, 1.0, 5.0, 4.0, 2.0, 6.0, 7.0, 8.0, 9.0, 0.5, 2.5, 3.5]
    trials = [FakeTrial(i, f) for i, f in enumerate(finals)]
    whole = drive(halving(trials, kind=kind), width=1)
    first = halving(trials, kind=kind)
    log, running = [], []
    while len(log) < 7:
        running += first.ask(1 - len(running))
        job = running.pop(0)
        log.append((job.trial.trial_id, job.rung, job.stop_at))
        first.tell(job, curve(job.trial, job.stop_at or 1.0))
    history = {}
    for trial_id, rung, stop in log:
        trial = next(t for t in trials if t.trial_id == trial_id)
        history.setdefault(trial_id, {})[rung] = curve(trial, stop or 1.0)
    done = {t for t, rung, _ in log if rung == 2}
    resumed = HalvingSearch(GridSearch([t for t in trials if t.trial_id not in done]),
                            objectives=parse_objectives(["val_loss:min"]), rungs=3, eta=3, kind=kind,
                            history=history)
    rest = drive(resumed, width=1)
    assert not {(t, r) for t, r, _ in rest} & {(t, r) for t, r, _ in log}  # nothing trained twice
    assert sorted(log + rest) == sorted(whole)


def test_asha_promotes_before_a_rung_is_full_and_halving_waits():
    trials = [FakeTrial(i, float(i)) for i in range(9)]
    asha = drive(halving(trials), width=1)
    first_promotion = next(i for i, (_, rung, _) in enumerate(asha) if rung == 1)
    assert first_promotion < 9  # promoted once three results were in
    sync = drive(halving(trials, kind="halving"), width=1)
    assert [rung for _, rung, _ in sync[:9]] == [0] * 9  # every trial at rung 0 before any promotion
    assert [t for t, rung, _ in sync if rung == 1] == ["t0", "t1", "t2"]
    assert [t for t, rung, _ in sync if rung == 2] == ["t0"]


def test_halving_with_more_slots_than_work_still_waits_for_the_rung():
    trials = [FakeTrial(i, float(-i)) for i in range(9)]
    search = halving(trials, kind="halving")
    first = search.ask(20)
    assert len(first) == 9 and search.ask(5) == []  # nothing to promote until rung 0 is in
    for job in first[:-1]:
        search.tell(job, curve(job.trial, job.stop_at))
    assert search.ask(5) == []
    search.tell(first[-1], curve(first[-1].trial, first[-1].stop_at))
    assert sorted(job.trial.trial_id for job in search.ask(5)) == ["t6", "t7", "t8"]


def test_a_failed_trial_is_never_promoted():
    trials = [FakeTrial(i, float(i)) for i in range(3)]
    search = halving(trials, rungs=2, eta=3)
    jobs = search.ask(3)
    search.tell(jobs[0], None)  # the best would have been t0; it failed
    for job in jobs[1:]:
        search.tell(job, curve(job.trial, job.stop_at))
    promoted = search.ask(3)
    assert [job.trial.trial_id for job in promoted] == ["t1"]


def test_several_objectives_promote_by_non_dominated_rank():
    # t0..t2 lie on the front of (loss min, speed max); t3..t8 are dominated by t1
    points = [(1.0, 1.0), (2.0, 5.0), (4.0, 9.0)] + [(2.5 + i, 4.0) for i in range(6)]
    trials = [FakeTrial(i, loss, speed) for i, (loss, speed) in enumerate(points)]
    search = halving(trials, kind="halving", rungs=2, objectives=("val_loss:min", "tokens_per_s:max"))
    log = drive(search, width=3)
    assert {t for t, rung, _ in log if rung == 1} == {"t0", "t1", "t2"}


def test_rank_order_puts_every_front_before_the_next():
    rng = random.Random(0)
    for _ in range(30):
        values = [[rng.randint(0, 5), rng.randint(0, 5)] for _ in range(12)]
        order = rank_order(values)
        assert sorted(order) == list(range(12))

        def dominated(i, among):
            return any(all(a <= b for a, b in zip(values[j], values[i])) and values[j] != values[i] for j in among)

        # brute force: the first k of the order never include a point dominated by a later one
        for k, i in enumerate(order):
            assert not dominated(i, order[k + 1:]), (values, order)


def test_hyperband_starts_each_bracket_at_a_later_rung_with_fewer_trials():
    brackets = _hyperband_brackets(3, 3, 27)
    assert [start for start, _ in brackets] == [0, 1, 2]
    sizes = [size for _, size in brackets]
    assert sizes[0] > sizes[1] > sizes[2] >= 1 and abs(sum(sizes) - 27) <= 1
    trials = [FakeTrial(i, float(i)) for i in range(sum(sizes))]
    log = drive(halving(trials, kind="hyperband"), width=2)
    first_rungs = {}
    for trial, rung, _ in log:
        first_rungs.setdefault(trial, rung)
    assert sorted(first_rungs.values()).count(2) == sizes[2]  # the last bracket trains straight to the end


def write_study(tmp_path, *, schedule="wsd", decay=0.2, eta=3, steps=18):
    (tmp_path / "space.yaml").write_text("name: s\naxes:\n  family: transformer\n  num_layers: 2\n"
                                         "  taper: {shape: [uniform, cosine]}\nmodel: {head_dim: 8}\n")
    path = tmp_path / "study.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: rungs
        space: space.yaml
        budget: {{targets: [6000, 12000], tolerance: 0.05}}
        data: {{kind: text, seq_len: 16}}
        recipe: {{steps: {steps}, batch_size: 2, schedule: {schedule}, decay_fraction: {decay}, warmup_steps: 1,
                  eval_every: 6, eval_batches: 1}}
        search: {{fidelity: {{kind: asha, rungs: 2, eta: {eta}}}}}
        """))
    return path


@pytest.mark.parametrize("schedule, decay, eta, message", [
    ("cosine", 0.2, 3, "needs recipe.schedule: wsd"),
    ("wsd", 0.8, 3, "falls in the decay phase"),
])
def test_rungs_that_cannot_continue_honestly_are_refused(tmp_path, schedule, decay, eta, message):
    from tests.test_errors import run_cli

    result = run_cli("plan", str(write_study(tmp_path, schedule=schedule, decay=decay, eta=eta)))
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_trial_stopped_at_a_rung_continues_exactly_like_an_uninterrupted_run(tmp_path):
    study = A.load_study(write_study(tmp_path))
    trial = A.plan(study)[0]
    kwargs = dict(spec=trial.spec, recipe=trial.recipe, data=trial.data, seed=0, threads=1)
    whole = A.train_trial(**kwargs)
    rung = A.train_trial(**kwargs, checkpoint_dir=tmp_path / "cp", stop_at=1 / 3)
    assert rung.steps == 6 and rung.tokens == whole.tokens // 3
    rest = A.train_trial(**kwargs, checkpoint_dir=tmp_path / "cp")
    assert rest.steps == whole.steps
    assert rest.val_loss == pytest.approx(whole.val_loss, abs=1e-6)
    assert [r["val_loss"] for r in rest.curve] == pytest.approx([r["val_loss"] for r in whole.curve], abs=1e-6)


@pytest.mark.ray
@pytest.mark.slow
def test_asha_on_ray_stores_rungs_and_pruned_trials(tmp_path):
    from archsearch.execute import run_study

    study = A.load_study(write_study(tmp_path))
    summary = run_study(study, store=tmp_path / "s.duckdb", show_progress=False)
    with A.open_store(tmp_path / "s.duckdb", read_only=True) as db:
        trials = {t["trial_id"]: t for t in db.trials("rungs").to_pylist()}
        rungs = db.sql("SELECT trial_id, rung, steps, val_loss FROM trial_rungs ORDER BY trial_id, rung").to_pylist()
    # asynchronous: with two workers a late, better rung-0 result can earn a
    # second promotion after the first (ASHA's known over-promotion), never more
    completed = [t for t in trials.values() if t["status"] == "completed"]
    pruned = [t for t in trials.values() if t["status"] == "pruned"]
    assert len(trials) == 4 and 1 <= len(completed) <= 2 and len(completed) + len(pruned) == 4
    assert summary.completed == len(completed)
    # the trials a rung stopped are counted as such, never as "already done"
    assert summary.pruned == len(pruned) and summary.skipped == 0
    assert all(t["steps"] == 6 and t["error"] == "pruned at rung 1 of 2" for t in pruned)
    assert all(t["steps"] == 18 for t in completed)
    assert {r["steps"] for r in rungs} == {6, 18} and len(rungs) == 4 + len(completed)
    at_rung = {r["trial_id"]: r for r in rungs if r["rung"] == 0}
    best = min(at_rung, key=lambda i: at_rung[i]["val_loss"])
    assert best in {t["trial_id"] for t in completed}
