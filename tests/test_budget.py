"""Budgets: every measure is matched within tolerance; protocols give arms."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import archsearch as A
from archsearch.budget import count_params, flops_per_token, state_size
from archsearch.space.schema import TAPER_SHAPES, Study


def study_of(tmp_path: Path, *, axes: str, budget: str, model: str = "head_dim: 16") -> A.Study:
    text = textwrap.dedent("""\
        name: b
        space:
          axes:
        {axes}
          model:
            {model}
        budget:
        {budget}
        data:
          kind: text
          seq_len: 64
        """).format(axes=textwrap.indent(textwrap.dedent(axes), "    "),
                    budget=textwrap.indent(textwrap.dedent(budget), "  "), model=model)
    (tmp_path / "study.yaml").write_text(text)
    return A.load_study(tmp_path / "study.yaml")


AXES = "num_layers: [2, 6]\ntaper:\n  shape: [uniform, cosine]\n"


def test_parameter_ladder_within_half_a_percent(tmp_path):
    study = study_of(tmp_path, axes=AXES, budget="targets: {start: 2.0e+5, stop: 2.0e+7, count: 5}\n")
    trials = A.plan(study)
    assert len(trials) == 2 * 2 * 5
    for trial in trials:
        assert abs(trial.match_error) <= 0.005
        assert trial.achieved == count_params(trial.spec)


def test_flops_matching_counts_training_flops_at_the_study_length(tmp_path):
    study = study_of(tmp_path, axes=AXES, budget="match: flops\ntargets: [5.0e+6, 5.0e+7]\n")
    for trial in A.plan(study):
        assert trial.achieved == flops_per_token(trial.spec, seq_len=64, kind="train")
        assert abs(trial.match_error) <= 0.005


def test_embeddings_can_count(tmp_path):
    study = study_of(tmp_path, axes="num_layers: 4\n", budget="targets: [1.0e+6]\ncount_embeddings: true\n")
    (trial,) = A.plan(study)
    assert trial.achieved == trial.total_params == count_params(trial.spec, embeddings=True)
    assert abs(trial.total_params / 1e6 - 1) <= 0.005


def test_state_matching_reports_the_kv_cache(tmp_path):
    study = study_of(tmp_path, axes="num_layers: 4\n", budget="match: state\ntargets: [65536]\ntolerance: 0.05\n")
    (trial,) = A.plan(study)
    assert trial.state == state_size(trial.spec, seq_len=64) == 2 * 4 * 64 * trial.spec.d_model


def test_solve_for_mlp_keeps_d_model(tmp_path):
    study = study_of(tmp_path, axes=AXES, budget="targets: [3.0e+6]\nsolve_for: mlp\n",
                     model="d_model: 256")
    for trial in A.plan(study):
        assert trial.spec.d_model == 256 and abs(trial.match_error) <= 0.005


@pytest.mark.parametrize("protocol", ["iso_param", "iso_flop"])
def test_looped_protocols_add_a_baseline_arm(tmp_path, protocol):
    study = study_of(tmp_path, axes="family: looped\nnum_layers: 2\nloops: 3\n",
                     budget=f"targets: [1.0e+6]\nprotocol: {protocol}\n")
    looped, baseline = A.plan(study)
    assert (looped.axes["arm"], baseline.axes["arm"]) == ("looped", "baseline")
    assert baseline.spec.structure == "stack"
    seq = 64
    if protocol == "iso_param":
        assert baseline.spec.num_layers == 2
        assert abs(baseline.params / looped.params - 1) < 0.01
        assert flops_per_token(baseline.spec, seq_len=seq) < flops_per_token(looped.spec, seq_len=seq)
    else:
        assert baseline.spec.num_layers == 6
        assert baseline.flops_per_token == pytest.approx(looped.flops_per_token, rel=0.01)
        assert baseline.params > 2.5 * looped.params
    assert baseline.match == protocol and abs(baseline.match_error) < 0.01


def test_an_unreachable_target_names_the_closest_and_a_fix(tmp_path):
    study = study_of(tmp_path, axes="num_layers: 2\n", budget="targets: [1.0e+6]\ntolerance: 0.0001\n",
                     model="head_dim: 64\n    multiple_of: 256")
    with pytest.raises(A.SpecError) as err:
        A.plan(study)
    text = str(err.value)
    assert "closest is" in text and "budget.targets[0]" in text and "multiple_of" in text


HRM_TAPER = "family: hrm\nnum_layers: 6\ntaper: {shape: cosine, ratio: 3.0}\nhrm: {N: 2, T: 3}\n"


def test_hrm_taper_flops_land_within_tolerance(tmp_path):
    """Issue 9's example planned at -7.1% and -8.1%: HRM weights the (wider, tapered) fast layers
    T times, so its FLOPs are not the line the solver fitted at the narrowest widths."""
    study = study_of(tmp_path, axes=HRM_TAPER, budget="match: flops\ntargets: [3.0e+6, 3.0e+7]\ntolerance: 0.01\n")
    trials = A.plan(study)
    assert len(trials) == 2
    for trial in trials:
        assert trial.achieved == flops_per_token(trial.spec, seq_len=64, kind="train")
        assert abs(trial.match_error) <= 0.01, trial.match_error


def test_the_solver_judges_the_exact_measure_not_its_line():
    """A measure far from affine in width (a square root): every returned error is the exact one."""
    from archsearch.budget import BudgetError, solve

    def measure(spec):
        d, width = spec
        return 40.0 * d * d + 5000.0 * d * math.sqrt(width)

    for target in (2e5, 3e6, 4e7):
        try:
            solution = solve(target=target, make_spec=lambda d, w: (d, w), measure=measure, num_layers=4,
                             head_dim=16, mlp_ratio=8 / 3, multiple_of=8, tolerance=0.005)
        except BudgetError as err:
            assert err.closest is not None and abs(err.closest / target - 1) > 0.005
            continue
        assert solution.achieved == measure(solution.spec)
        assert abs(solution.achieved / target - 1) <= 0.005


def test_a_plan_outside_tolerance_is_refused_naming_the_trial(tmp_path, monkeypatch):
    """The planner's own check of every trial's achieved value, whatever the solver returned."""
    import archsearch.planner as planner
    from archsearch.budget import Solution

    def off_by_two_percent(**kwargs):
        spec = kwargs["make_spec"](64, 4 * 64 * 3)
        return Solution(spec, kwargs["target"] * 1.02, 0.02)

    study = study_of(tmp_path, axes="num_layers: 4\n", budget="targets: [1.0e+6]\n")
    monkeypatch.setattr(planner, "solve", off_by_two_percent)
    with pytest.raises(A.SpecError) as err:
        A.plan(study)
    text = str(err.value)
    assert "\n" not in text and "budget.targets[0]" in text and "num_layers=4" in text
    assert "outside the tolerance" in text


def test_looped_iso_flop_baselines_match_each_gated_and_ungated_arm(tmp_path):
    """Issue 9: with an exit gate the loops x k baseline was 6.7% off (per-loop heads and the gate
    unmatched, width never solved), and the gated arm's baseline hashed to the ungated one's."""
    study = study_of(tmp_path, axes="family: looped\nnum_layers: 2\nloops: 4\nexit_gate: [false, true]\n"
                                    "hybrid: {pattern: MA}\n", budget="targets: [1.0e+6]\nprotocol: iso_flop\n")
    trials = A.plan(study)
    arms = {(t.axes["exit_gate"], t.axes["arm"]): t for t in trials}
    assert len(trials) == len(arms) == 4
    for gate in (False, True):
        looped, baseline = arms[gate, "looped"], arms[gate, "baseline"]
        assert baseline.spec.structure == "stack" and baseline.spec.num_layers == 8
        assert baseline.target == looped.flops_per_token
        assert baseline.achieved == baseline.flops_per_token
        assert abs(baseline.flops_per_token / looped.flops_per_token - 1) <= 0.005
    assert arms[True, "baseline"].trial_id != arms[False, "baseline"].trial_id


def test_gated_and_ungated_iso_param_baselines_keep_their_own_ids(tmp_path):
    """The gate adds D + 1 parameters: both arms' baselines can be the same model, but each is its
    own trial, paired with its arm."""
    study = study_of(tmp_path, axes="family: looped\nnum_layers: 2\nloops: 3\nexit_gate: [false, true]\n",
                     budget="targets: [1.0e+6]\nprotocol: iso_param\n")
    trials = A.plan(study)
    baselines = [t for t in trials if t.axes["arm"] == "baseline"]
    assert len(trials) == 4 and len({t.trial_id for t in baselines}) == 2
    for trial in baselines:
        assert abs(trial.match_error) <= 0.005 and trial.achieved == count_params(trial.spec)


@pytest.mark.parametrize("protocol", ["iso_param", "iso_flop"])
def test_hrm_is_paired_with_a_universal_transformer(tmp_path, protocol):
    """HRM N x T against the UT over the same layers for N * T steps, the UT's MLP width solved to
    HRM's parameters (iso_param) or training FLOPs (iso_flop)."""
    study = study_of(tmp_path, axes=HRM_TAPER, budget=f"targets: [3.0e+5]\nprotocol: {protocol}\n")
    hrm, ut = A.plan(study)
    assert (hrm.axes["arm"], ut.axes["arm"]) == ("hrm", "baseline")
    assert ut.spec.structure == "universal" and ut.spec.options == {"steps": 6}
    assert ut.spec.num_layers == hrm.spec.num_layers == 6
    assert ut.match == protocol
    if protocol == "iso_param":
        assert ut.target == hrm.params and abs(ut.params / hrm.params - 1) <= 0.005
    else:
        assert ut.target == hrm.flops_per_token
        assert abs(ut.flops_per_token / hrm.flops_per_token - 1) <= 0.005
        assert ut.flops_per_token == flops_per_token(ut.spec, seq_len=64, kind="train")


FAMILIES = ["transformer", "gated_attention", "mamba", "gdn", "hybrid", "looped", "memory", "gpn", "hrm",
            "universal", "titans", "hope"]
TARGETS = {"params": (2e5, 2e7), "flops": (2e6, 2e8), "state": (2e3, 2e6)}


@pytest.mark.parametrize("family", FAMILIES)
@settings(max_examples=15, deadline=None, derandomize=True, database=None)
@given(shape=st.sampled_from(TAPER_SHAPES), match=st.sampled_from(list(TARGETS)), num_layers=st.integers(1, 6),
       ratio=st.floats(1.0, 5.0), multiple_of=st.sampled_from([8, 16, 32]), head_dim=st.sampled_from([8, 16]),
       position=st.floats(0.0, 1.0), tolerance=st.sampled_from([0.005, 0.02]), fast_steps=st.integers(2, 3),
       protocol=st.sampled_from(["none", "iso_param", "iso_flop"]), gate=st.booleans())
def test_every_planned_trial_is_within_tolerance_or_refused(family, shape, match, num_layers, ratio, multiple_of,
                                                            head_dim, position, tolerance, fast_steps, protocol,
                                                            gate):
    """Every family x taper shape x match kind: each trial's exact measure (the count functions on
    its rounded spec) is within tolerance, or the plan is refused in one line naming the trial.
    Parameter and FLOP targets in these ranges are always reached (HRM needs two layers); some
    state targets are not (an SSM's state does not grow with the sequence, and the state moves in
    steps of one head)."""
    low, high = TARGETS[match]
    target = low * (high / low) ** position
    study = Study.model_validate({
        "name": "p", "data": {"kind": "text", "seq_len": 32},
        "space": {"axes": {"family": family, "num_layers": num_layers, "taper": {"shape": shape, "ratio": ratio},
                           "loops": 3, "exit_gate": gate, "hrm": {"N": 2, "T": fast_steps}},
                  "model": {"head_dim": head_dim, "multiple_of": multiple_of}},
        "budget": {"match": match, "targets": [target], "tolerance": tolerance, "protocol": protocol},
        # what is checked here is the match; a state target can plan a model of tens of GB (test_hostile_plan)
        "execution": {"memory_check": False}})
    measure = {"params": lambda t: count_params(t.spec), "state": lambda t: state_size(t.spec, seq_len=32),
               "flops": lambda t: flops_per_token(t.spec, seq_len=32, kind="train")}
    try:
        trials = A.plan(study)
    except A.SpecError as err:
        text = str(err)
        assert "\n" not in text and f"trial (family={family}" in text
        assert match == "state" or (family == "hrm" and num_layers == 1), text
        return
    for trial in trials:
        assert abs(trial.match_error) <= tolerance, trial.to_dict()
        if trial.match in TARGETS:
            assert trial.achieved == measure[trial.match](trial)
        else:  # a protocol's baseline, matched to its partner's params or FLOPs
            kind = "params" if trial.match == "iso_param" else "flops"
            assert trial.achieved == measure[kind](trial)


def test_a_swept_learning_rate_keeps_each_baseline_with_its_arm(tmp_path):
    """With an lr sweep, the two (identical) iso_param baselines of a gated and an ungated arm are
    four trials in two sweep groups, one per arm, not one group of four."""
    study_of(tmp_path, axes="family: looped\nnum_layers: 2\nloops: 3\nexit_gate: [false, true]\n",
             budget="targets: [1.0e+6]\nprotocol: iso_param\n")
    path = tmp_path / "study.yaml"
    path.write_text(path.read_text() + "recipe:\n  lr: {sweep: [1.0e-3, 3.0e-3]}\n")
    baselines = [t for t in A.plan(A.load_study(path)) if t.axes["arm"] == "baseline"]
    assert len({t.trial_id for t in baselines}) == 4
    groups = {}
    for trial in baselines:
        groups.setdefault(trial.sweep_group, set()).add(trial.axes["exit_gate"])
    assert sorted(map(sorted, groups.values())) == [[False], [True]]


def test_an_unreachable_baseline_is_refused_naming_its_partner(tmp_path):
    """HRM reaches 2e5 parameters at d_model 64, but the UT's MLP steps (16 wide, six layers, six
    steps) cannot land within 0.5% of HRM's FLOPs there."""
    study = study_of(tmp_path, axes=HRM_TAPER, budget="targets: [2.0e+5]\nprotocol: iso_flop\nsolve_for: mlp\n",
                     model="d_model: 64\n    multiple_of: 16")
    with pytest.raises(A.SpecError) as err:
        A.plan(study)
    text = str(err.value)
    assert "\n" not in text and "trial (family=hrm" in text and "budget.targets[0]" in text
    assert "its iso_flop baseline: no width reaches target" in text and "closest is" in text


def test_the_solvers_tolerance_is_its_own_bound():
    """The solver's own refusal, without the planner's second check behind it: one layer of
    steps of 64 reaches 1024 nearest a target of 1000 (+2.4%). A tolerance just below that
    error refuses, naming the closest value; one equal to it accepts (the bound is inclusive)."""
    from archsearch.budget import BudgetError, solve

    error = 1024 / 1000 - 1

    def solve_within(tolerance: float):
        return solve(target=1000.0, make_spec=lambda d, w: (d, w), measure=lambda spec: float(spec[1]),
                     num_layers=1, head_dim=16, mlp_ratio=4.0, multiple_of=64, tolerance=tolerance)

    with pytest.raises(BudgetError, match=r"closest is 1024 \(\+2\.40%\)") as err:
        solve_within(error * (1 - 1e-6))
    assert err.value.closest == 1024
    solution = solve_within(error)
    assert solution.spec[1] == solution.achieved == 1024 and solution.match_error == error
    assert solve_within(0.5).match_error == error  # the nearest, not merely one inside a loose bound


def test_a_target_below_the_smallest_model_says_so():
    """Not "no width reaches": the target is below what one multiple per layer at the smallest
    d_model already has, and the error names that smallest value."""
    from archsearch.budget import BudgetError, solve

    def measure(spec):
        d, width = spec
        return 100.0 * d + width

    smallest = measure((16, 4 * 8))
    with pytest.raises(BudgetError, match=r"below the smallest model \(1632\)") as err:
        solve(target=0.75 * smallest, make_spec=lambda d, w: (d, w), measure=measure, num_layers=4, head_dim=16,
              mlp_ratio=8 / 3, multiple_of=8, tolerance=0.3)
    assert err.value.closest == smallest == 1632
