"""One trial trains: loss falls, runs are deterministic, the schedule is right."""

from __future__ import annotations

import pytest

from archsearch.arch.spec import ArchSpec, LayerSpec
from archsearch.data.text import ByteCorpus
from archsearch.space.schema import Recipe
from archsearch.train import lr_at, train_trial

SPEC = ArchSpec(family="transformer", vocab_size=256, d_model=32, num_heads=4,
                layers=tuple(LayerSpec(mlp_width=w) for w in (96, 64)))


def recipe(**overrides) -> dict:
    fields = dict(steps=60, batch_size=8, lr=3e-3, warmup_steps=5, eval_every=20, eval_batches=2)
    return Recipe(**{**fields, **overrides}).model_dump()


def test_loss_falls_on_text(corpus):
    source = ByteCorpus(paths=[str(corpus)], seq_len=32)
    result = train_trial(spec=SPEC, recipe=recipe(), data=source, seed=0, threads=1)
    assert result.curve[0]["step"] == 20 and result.curve[-1]["step"] == 60
    assert result.val_loss < 4.0 < 5.545  # log(256) = 5.545 is chance
    assert result.curve[-1]["val_loss"] < result.curve[0]["val_loss"]
    assert result.tokens == 60 * 8 * 32 and result.tokens_per_s > 0


def test_same_seed_same_losses_other_seed_other_losses(corpus):
    source = ByteCorpus(paths=[str(corpus)], seq_len=16)
    short = recipe(steps=10, eval_every=5)
    a = train_trial(spec=SPEC, recipe=short, data=source, seed=3)
    b = train_trial(spec=SPEC, recipe=short, data=source, seed=3)
    c = train_trial(spec=SPEC, recipe=short, data=source, seed=4)
    assert [r["val_loss"] for r in a.curve] == [r["val_loss"] for r in b.curve]
    assert a.train_loss == b.train_loss != c.train_loss


class Preempted(Exception):
    pass


def preempted_then_resumed(folder, **kwargs):
    """The trial killed at its first evaluation (after a checkpoint at step 4), then started again."""
    def preempt(row):
        raise Preempted

    with pytest.raises(Preempted):
        train_trial(**kwargs, checkpoint_dir=folder, checkpoint_every=4, on_eval=preempt)
    return train_trial(**kwargs, checkpoint_dir=folder, checkpoint_every=4)


@pytest.mark.parametrize("variant", [dict(grad_accum=2), dict(schedule="wsd", decay_fraction=0.5),
                                     dict(grad_accum=4, schedule="wsd", resume=True)],
                         ids=["grad_accum", "wsd", "wsd+grad_accum+resume"])
def test_same_trial_twice_same_losses(corpus, tmp_path, variant):
    source = ByteCorpus(paths=[str(corpus)], seq_len=16)
    variant = dict(variant)
    resume = variant.pop("resume", False)
    kwargs = dict(spec=SPEC, recipe=recipe(steps=10, eval_every=5, **variant), data=source, seed=3, threads=1)
    a = train_trial(**kwargs)
    b = preempted_then_resumed(tmp_path, **kwargs) if resume else train_trial(**kwargs)
    assert a.curve == b.curve and len(a.curve) == 2


def test_warmup_then_cosine_to_the_floor():
    kw = dict(lr=1.0, warmup_steps=10, steps=110, min_lr_ratio=0.1)
    assert lr_at(0, **kw) == pytest.approx(0.1)
    assert lr_at(9, **kw) == pytest.approx(1.0)
    assert lr_at(60, **kw) == pytest.approx(0.55)
    assert lr_at(110, **kw) == pytest.approx(0.1)
    assert all(lr_at(s, **kw) >= lr_at(s + 1, **kw) for s in range(10, 110))


def test_training_reports_its_loss_curve_and_where_it_is_between_evaluations(corpus):
    """Every ``log_every`` steps a training-loss row (the mean of the steps since the last), and
    progress reports carrying them, the first after the first step; together they give the
    whole curve, and the last report stands at the end."""
    source = ByteCorpus(paths=[str(corpus)], seq_len=16)
    reports, rows = [], []

    def heard(report, new_rows):
        reports.append(report)
        rows.extend(new_rows)

    result = train_trial(spec=SPEC, recipe=recipe(steps=25, eval_every=10, log_every=4), data=source, seed=0,
                         on_progress=heard)
    assert [r["step"] for r in rows] == [4, 8, 12, 16, 20, 24, 25]
    assert all(r["tokens"] == r["step"] * 8 * 16 for r in rows)
    assert reports[0]["step"] == 1 and reports[-1]["step"] == 25 == reports[-1]["total_steps"]
    assert reports[-1]["total_tokens"] == result.tokens and reports[-1]["tokens_per_s"] > 0
    assert rows[0]["train_loss"] > rows[-1]["train_loss"]  # it learns
    # the mean of the last ten steps, as the result's train_loss is
    assert reports[-1]["train_loss"] == pytest.approx(result.train_loss)


def test_a_report_of_progress_comes_every_few_seconds_not_every_step():
    from archsearch.train.progress import Reporter

    now, sent = [0.0], []
    reporter = Reporter(on_progress=lambda report, rows: sent.append((report, rows)), log_every=2,
                        total_steps=100, step=40, tokens=40 * 10, every_s=2.0, clock=lambda: now[0])
    for step in range(41, 61):
        now[0] += 0.5
        reporter.after_step(step=step, tokens=step * 10, loss=float(step), lr=1e-3)
    # at step 41 (the first), then each time 2 s have passed: 45, 49, 53, 57
    assert [report["step"] for report, _ in sent] == [41, 45, 49, 53, 57]
    assert [row["step"] for _, rows in sent for row in rows] == [42, 44, 46, 48, 50, 52, 54, 56]
    assert sent[1][1][0]["train_loss"] == (41 + 42) / 2  # the steps since the previous row, resumed at 40
    report = sent[-1][0]
    # the rate leaves out the first step, which pays for warming up
    assert sent[0][0]["tokens_per_s"] is None
    assert report["total_tokens"] == 1000 and report["tokens_per_s"] == pytest.approx(160 / 8.0)
