"""``archsearch compare`` and ``analysis.compare_arms``: a loss difference between arms over seeds.

Planted data: a real difference is found and its interval holds it, a null one
is rarely significant, pairing is chosen by the seeds, and the p-values agree
with scipy and with a count by hand. Planted mutations that fail here: pairing
the two arms in row order instead of by seed (test_pairs_by_seed_not_by_row_order),
Welch's degrees of freedom replaced by n1 + n2 - 2 (test_welch_matches_scipy), and
Holm's factor (m - rank) replaced by m (test_holm_adjusts_over_the_arms).
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from archsearch import analysis
from archsearch.analysis.arms import arm_labels
from tests.analysis_support import cli_json, one_line_error, protocol_loss, protocol_store, write_store

SEEDS = range(5)


def arms(rng, *, shift: float, seeds=SEEDS, seed_spread: float = 0.3, noise: float = 0.01) -> list[dict]:
    """A baseline and one arm ``shift`` below or above it; every seed moves both arms alike by N(0, seed_spread)."""
    rows = []
    for s in seeds:
        offset = rng.normal(0, seed_spread)
        rows.append(dict(family="transformer", seed=s, val_loss=3.0 + offset + rng.normal(0, noise)))
        rows.append(dict(family="memory", seed=s, val_loss=3.0 + shift + offset + rng.normal(0, noise)))
    return rows


def test_a_planted_difference_is_significant_and_its_interval_holds_it():
    result = analysis.compare_arms(arms(np.random.default_rng(0), shift=-0.1), baseline="transformer", by="family")
    d = result.get("memory")
    assert (d.test, d.paired, d.pairs, d.below) == ("paired t", True, 5, 5)
    assert d.p_value < 0.001 and d.low < -0.1 < d.high < 0
    # 5 pairs all below: the sign-flip test's smallest p, 2 of the 32 sign patterns
    assert d.p_permutation == pytest.approx(2 / 32)


def test_a_null_difference_is_rarely_significant():
    """200 planted nulls at 8 seeds: about 5% of t-tests and permutation tests below 0.05."""
    rng = np.random.default_rng(1)
    results = [analysis.compare_arms(arms(rng, shift=0.0, seeds=range(8)), baseline="transformer",
                                     by="family").get("memory") for _ in range(200)]
    t_rate = np.mean([d.p_value < 0.05 for d in results])
    perm_rate = np.mean([d.p_permutation < 0.05 for d in results])
    assert 0.01 <= t_rate <= 0.10 and 0.01 <= perm_rate <= 0.10
    assert np.mean([d.low <= 0 <= d.high for d in results]) >= 0.9  # the 95% interval covers the truth


def test_pairing_removes_the_seed_effect_welch_cannot():
    """The same values: paired by seed the small difference is clear; with one
    arm's seeds renamed (nothing to pair) Welch's test drowns in the seed spread."""
    rows = arms(np.random.default_rng(2), shift=-0.05)
    paired = analysis.compare_arms(rows, baseline="transformer", by="family").get("memory")
    renamed = [dict(r, seed=r["seed"] + 100) if r["family"] == "memory" else r for r in rows]
    welch = analysis.compare_arms(renamed, baseline="transformer", by="family").get("memory")
    assert paired.paired and paired.p_value < 0.01
    assert not welch.paired and welch.test == "Welch t" and welch.p_value > 0.5
    assert welch.note == "unpaired: the arms' seeds differ" and welch.below is None
    assert welch.difference == pytest.approx(paired.difference)


def test_several_trials_per_seed_or_a_missing_seed_is_unpaired():
    rows = arms(np.random.default_rng(3), shift=-0.1)
    missing = rows[:-1]  # the memory arm lost seed 4
    assert not analysis.compare_arms(missing, baseline="transformer", by="family").get("memory").paired
    pooled = rows + [dict(r, val_loss=r["val_loss"] + 0.01) for r in rows if r["family"] == "memory"]
    d = analysis.compare_arms(pooled, baseline="transformer", by="family").get("memory")
    assert (d.paired, d.n, d.n_baseline) == (False, 10, 5)
    assert d.note == "unpaired: an arm has several trials per seed"


def test_pairs_by_seed_not_by_row_order():
    rows = arms(np.random.default_rng(4), shift=-0.1)
    base = [r for r in rows if r["family"] == "transformer"]
    arm = [r for r in rows if r["family"] == "memory"][::-1]
    d = analysis.compare_arms(base + arm, baseline="transformer", by="family").get("memory")
    x = [r["val_loss"] for r in sorted(arm, key=lambda r: r["seed"])]
    y = [r["val_loss"] for r in base]
    assert d.p_value == pytest.approx(stats.ttest_rel(x, y).pvalue, rel=1e-9)


X = [2.91, 2.85, 3.02, 2.97, 2.88, 2.93]
Y = [2.95, 2.90, 3.01, 3.04, 2.93, 2.99]


def test_paired_t_matches_scipy():
    rows = [dict(arm="a", seed=i, loss=v) for i, v in enumerate(X)] + \
           [dict(arm="b", seed=i, loss=v) for i, v in enumerate(Y)]
    d = analysis.compare_arms(rows, baseline="b", by="arm", metric="loss").get("a")
    ref = stats.ttest_rel(X, Y)
    ci = ref.confidence_interval(0.95)
    assert d.p_value == pytest.approx(ref.pvalue, rel=1e-9)
    assert (d.low, d.high) == (pytest.approx(ci.low, rel=1e-9), pytest.approx(ci.high, rel=1e-9))
    assert d.difference == pytest.approx(np.mean(np.subtract(X, Y)))
    # by hand: differences -.04 -.05 +.01 -.07 -.05 -.06; only the all-flipped
    # pattern and the one flipping +.01 reach |mean| >= .26/6 on either side: 4 of 64
    assert d.p_permutation == pytest.approx(4 / 64)


def test_welch_matches_scipy():
    rows = [dict(arm="a", seed=i, loss=v) for i, v in enumerate(X)] + \
           [dict(arm="b", seed=10 + i, loss=v) for i, v in enumerate(Y[:4])]
    d = analysis.compare_arms(rows, baseline="b", by="arm", metric="loss").get("a")
    ref = stats.ttest_ind(X, Y[:4], equal_var=False)
    ci = ref.confidence_interval(0.95)
    assert d.test == "Welch t" and d.p_value == pytest.approx(ref.pvalue, rel=1e-9)
    assert (d.low, d.high) == (pytest.approx(ci.low, rel=1e-9), pytest.approx(ci.high, rel=1e-9))
    # 10 values into 6 and 4: C(10, 4) = 210 splits, enumerated
    exact = stats.permutation_test((X, Y[:4]), lambda a, b: np.mean(a) - np.mean(b), n_resamples=10**6)
    assert d.p_permutation == pytest.approx(exact.pvalue)


def test_holm_adjusts_over_the_arms():
    rng = np.random.default_rng(5)
    rows = arms(rng, shift=-0.1)
    for name, shift in (("gdn", -0.02), ("mamba", 0.005)):
        rows += [dict(r, family=name, val_loss=r["val_loss"] + shift + rng.normal(0, 0.01))
                 for r in rows if r["family"] == "transformer"]
    result = analysis.compare_arms(rows, baseline="transformer", by="family")
    ps = sorted((d.p_value, d.arm) for d in result.differences)
    expected, running = {}, 0.0
    for rank, (p, arm) in enumerate(ps):
        running = max(running, min(1.0, (3 - rank) * p))
        expected[arm] = running
    assert {d.arm: d.p_holm for d in result.differences} == pytest.approx(expected)
    assert [d.arm for d in result.differences] == ["gdn", "mamba", "memory"]


def test_arms_default_to_the_axes_that_vary():
    """The memory's slots (the same in every memory arm, absent from the
    transformer) name no arm; an axis only some rows have names one where it
    splits them (a protocol's baseline arm)."""
    rows = []
    for s in SEEDS:
        rows.append(dict(axes={"family": "transformer", "num_layers": 6}, seed=s, val_loss=3.0 + s / 100))
        for aux in ("none", "self"):
            rows.append(dict(axes={"family": "memory", "num_layers": 6, "memory.aux": aux, "memory.slots": 4},
                             seed=s, val_loss=2.9 + s / 100))
    result = analysis.compare_arms(rows, baseline="transformer")
    assert result.by == ["family", "memory.aux"] and result.baseline == "family=transformer"
    assert analysis.varying_axes([{"family": "looped"}, {"family": "looped", "arm": "baseline"}]) == ["arm"]
    assert [d.arm for d in result.differences] == ["family=memory memory.aux=none", "family=memory memory.aux=self"]
    assert analysis.compare_arms(rows, baseline="memory.aux=none").baseline == "family=memory memory.aux=none"
    with pytest.raises(ValueError, match="baseline 'memory' matches 2 arms"):
        analysis.compare_arms(rows, baseline="memory")


def _store(tmp_path):
    rng = np.random.default_rng(6)
    trials = []
    for row in arms(rng, shift=-0.1):
        trials.append(dict(family=row["family"], axes={"family": row["family"]}, seed=row["seed"], params=1000,
                           achieved=1000.0, target=1000.0, val_loss=row["val_loss"], tokens_per_s=1.0,
                           train_loss=row["val_loss"] - (0.3 if row["family"] == "memory" else 0.1)))
    return write_store(tmp_path / "s.duckdb", trials=trials)


def test_the_cli_compares_a_store(tmp_path):
    store = _store(tmp_path)
    out = cli_json("compare", "--store", str(store), "--baseline", "transformer")
    (d,) = out["differences"]
    assert (out["metric"], out["baseline"], d["arm"], d["test"]) == ("val_loss", "transformer", "memory", "paired t")
    assert d["p_value"] < 0.01 and d["high"] < 0
    # the generalisation gap, planted 0.3 against 0.1: +0.2 on every seed
    gap = cli_json("compare", "--store", str(store), "--baseline", "transformer", "--metric", "gen_gap")
    assert gap["differences"][0]["difference"] == pytest.approx(0.2)


def test_the_cli_table_and_its_errors(tmp_path):
    from typer.testing import CliRunner

    from archsearch.cli import app

    store = _store(tmp_path)
    result = CliRunner().invoke(app, ["compare", "--store", str(store), "--baseline", "transformer"])
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if line.startswith("memory")).split()
    assert row[1] == "5/5" and row[-1] == "5/5" and "paired" in row
    assert "no arm matches baseline 'mamba'; the arms are: memory; transformer" in one_line_error(
        "compare", "--store", str(store), "--baseline", "mamba")
    assert "no metric column 'loss'" in one_line_error("compare", "--store", str(store), "--baseline",
                                                       "transformer", "--metric", "loss")
    csv = tmp_path / "r.csv"
    csv.write_text("arm,seed,loss\na,0,1.0\nb,0,2.0\n")
    assert "say which columns make an arm with by (--by)" in one_line_error(
        "compare", "--from-csv", str(csv), "--baseline", "a", "--metric", "loss")
    assert "arm 'b' has 1 result for loss; a test over seeds needs at least 2" in one_line_error(
        "compare", "--from-csv", str(csv), "--baseline", "a", "--metric", "loss", "--by", "arm")


def test_within_compares_each_group_with_its_own_baseline():
    """Taper against uniform per family: cosine is 0.1 below uniform in the
    transformer and level with it in titans; titans sits 0.5 above throughout."""
    rng = np.random.default_rng(7)
    rows = []
    for s in SEEDS:
        offset = rng.normal(0, 0.2)
        for family, base, gain in (("transformer", 3.0, -0.1), ("titans", 3.5, 0.0)):
            for shape, shift in (("uniform", 0.0), ("cosine", gain)):
                rows.append(dict(axes={"family": family, "taper.shape": shape}, seed=s,
                                 val_loss=base + shift + offset + rng.normal(0, 0.005)))
    result = analysis.compare_arms(rows, baseline="uniform", within="family")
    assert result.by == ["taper.shape"] and result.baseline == "uniform"
    transformer, titans = result.get("cosine", "transformer"), result.get("cosine", "titans")
    assert transformer.difference == pytest.approx(-0.1, abs=0.01) and transformer.p_value < 0.001
    assert abs(titans.difference) < 0.01 and titans.p_value > 0.05
    with pytest.raises(ValueError, match="no arm of titans matches baseline 'reverse'"):
        analysis.compare_arms(rows, baseline="reverse", within="family")


def test_the_iso_param_and_iso_flop_baselines_are_two_arms(tmp_path):
    """A looped point run under both protocols into one store: its two
    baselines share their axes (``arm: baseline``) but are two models, so by
    default two arms, named in the JSON and the table by protocol and model,
    each paired with the looped arm over its 3 seeds. Fails on the old arms, which pooled the 6 baseline
    trials into one unpaired ``baseline``."""
    from typer.testing import CliRunner

    from archsearch.cli import app
    store = protocol_store(tmp_path / "p.duckdb")
    out = cli_json("compare", "--store", str(store), "--baseline", "iso-param")
    assert out["baseline"] == "baseline (iso-param: 2-layer stack)"
    (looped, flop) = sorted(out["differences"], key=lambda d: d["arm"], reverse=True)
    assert (looped["arm"], flop["arm"]) == ("looped", "baseline (iso-FLOP: 4-layer stack)")
    assert all(d["test"] == "paired t" and d["n_baseline"] == 3 for d in out["differences"])
    gap = {arm: protocol_loss(arm, 20_000, 0) - protocol_loss("param", 20_000, 0) for arm in ("looped", "flop")}
    assert looped["difference"] == pytest.approx(gap["looped"]) and flop["difference"] == pytest.approx(gap["flop"])
    # the protocol as the study file spells it picks the same arm
    assert cli_json("compare", "--store", str(store), "--baseline", "iso_flop")["baseline"] == flop["arm"]
    table = CliRunner().invoke(app, ["compare", "--store", str(store), "--baseline", "iso-param"]).output
    assert "baseline (iso-FLOP: 4-layer stack)" in " ".join(table.split())
    assert "baseline 'baseline' matches 2 arms" in one_line_error("compare", "--store", str(store), "--baseline",
                                                                   "baseline")


def test_arms_alike_but_for_their_match_kind_are_two_arms():
    """One transformer matched on parameters and one on FLOPs (two runs of a
    study into one store) have one axes dict: by default two arms, as the
    report names them, not the error that there is one arm."""
    axes = {"family": "transformer", "num_layers": 4}
    rows = [dict(axes=axes, family="transformer", match=match, seed=s, val_loss=3.0 + shift + s / 100)
            for match, shift in (("params", 0.0), ("flops", -0.1)) for s in SEEDS]
    result = analysis.compare_arms(rows, baseline="params")
    assert result.baseline == "transformer (matched on params)"
    (d,) = result.differences
    assert d.arm == "transformer (matched on flops)" and d.difference == pytest.approx(-0.1) and d.paired
    with pytest.raises(ValueError, match="every trial has the same axes"):
        analysis.compare_arms([dict(r, match="params") for r in rows], baseline="transformer")


def _two_sizes(rng) -> list[dict]:
    """Two families at two budget targets, 4 seeds each; the small size's loss is 0.5 higher."""
    rows = []
    for target, level in ((1e6, 3.5), (4e6, 3.0)):
        for row in arms(rng, shift=-0.1, seeds=range(4)):
            rows.append({**row, "target": target, "val_loss": row["val_loss"] + level - 3.0})
    return rows


def test_sizes_are_compared_apart_by_default_and_pooled_only_when_asked():
    """Arms of several budget targets meet the baseline at their own target (the default
    pooled both sizes into one Welch test, where the sizes' 0.5 gap swamps the 0.1 difference)."""
    rows = _two_sizes(np.random.default_rng(3))
    result = analysis.compare_arms(rows, baseline="transformer", by="family")
    assert [(d.group, d.paired) for d in result.differences] == [("1e+06", True), ("4e+06", True)]
    assert all(d.difference == pytest.approx(-0.1, abs=0.03) and d.p_value < 0.01 for d in result.differences)
    assert any("2 budget targets: each arm is compared with the baseline at its own target" in n for n in result.notes)
    pooled = analysis.compare_arms(rows, baseline="transformer", by="family", pool=True)
    (d,) = pooled.differences
    assert d.group is None and not d.paired and d.n == 8
    assert any("pooled 2 budget targets" in n for n in pooled.notes)


def test_a_baseline_named_key_value_matches_an_arm_named_by_its_value_alone():
    """Arms named by one key show its values alone (transformer); `family=transformer` picks the
    same arm instead of an error that listed 'transformer' among the arms it said did not match."""
    rows = _two_sizes(np.random.default_rng(4))
    named = analysis.compare_arms(rows, baseline="family=transformer", by="family")
    assert [d.baseline for d in named.differences] == ["transformer", "transformer"]
    with pytest.raises(ValueError, match=r"no arm of 1e\+06 matches baseline 'family=mamba'; the arms of 1e\+06 "
                                         r"are: memory; transformer$"):
        analysis.compare_arms(rows, baseline="family=mamba", by="family")


def test_too_few_seeds_at_one_target_says_how_to_pool():
    rows = [{**r, "seed": 0} for r in _two_sizes(np.random.default_rng(5)) if r["seed"] == 0]
    with pytest.raises(ValueError, match="at target 1e\\+06, or give --pool to test over every size at once"):
        analysis.compare_arms(rows, baseline="transformer", by="family")


def test_a_boolean_arm_reads_as_a_study_file_writes_it():
    """Labels show a boolean axis as the study file writes it (false, memory=false), and a
    baseline written so, or as Python prints it (False), names that arm."""
    rng = np.random.default_rng(3)
    rows = [dict(axes={"memory": memory}, seed=s, val_loss=3.0 + 0.1 * memory + rng.normal(0, 0.01))
            for s in SEEDS for memory in (False, True)]
    for baseline in ("False", "false", "memory=false"):
        result = analysis.compare_arms(rows, baseline=baseline)
        assert result.baseline == "false" and result.get("true").difference == pytest.approx(0.1, abs=0.02)
    two = [dict(axes={"memory": memory, "layers": layers}) for memory in (False, True) for layers in (1, 2)]
    assert arm_labels(two) == ["memory=false, layers=1", "memory=false, layers=2",
                              "memory=true, layers=1", "memory=true, layers=2"]
    with pytest.raises(ValueError, match="no arm matches baseline 'no'"):
        analysis.compare_arms(rows, baseline="no")
