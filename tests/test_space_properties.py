"""Property tests: no input crashes or hangs the study loader.

Whatever bytes or YAML structure a user hands in, loading either returns a
study or raises SpecError: never another exception.
"""

from __future__ import annotations

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import archsearch as A
import archsearch.planner  # noqa: F401  (imports torch now, not inside the first timed example)

KEYS = ["name", "space", "axes", "num_layers", "taper", "shape", "ratio", "budget", "targets", "data", "kind",
        "recipe", "lr", "steps", "derived", "constraints", "when", "values", "low", "high", "grid", "include",
        "family", "loops", "seeds", "match", "tolerance", "x", "__class__"]
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=True),
                    st.text(max_size=30), st.sampled_from(["cosine", "transformer", "looped", "1e-3", "3:1",
                                                           "num_layers * 2", "__import__('os')", "[", "*a"]))
TREES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(KEYS), inner, max_size=5)), max_leaves=25)

SETTINGS = settings(max_examples=150, deadline=5000, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def load(path) -> None:
    try:
        A.load_study(path)
    except A.SpecError:
        pass


@SETTINGS
@given(data=st.binary(max_size=400))
def test_arbitrary_bytes_never_crash(tmp_path, data):
    path = tmp_path / "study.yaml"
    path.write_bytes(data)
    load(path)


@SETTINGS
@given(tree=TREES)
def test_arbitrary_yaml_structures_never_crash(tmp_path, tree):
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(tree))
    load(path)


# Constraints drawn from the expression grammar (space/expr.py): names of the
# axes, numbers, arithmetic, calls, comparisons, membership, and/or/not and
# conditionals, so most parse, and many hold for some point.
NUMBERS = st.one_of(st.sampled_from(["num_layers", "taper_ratio", "num_layers", "loops"]),
                    st.integers(0, 12).map(str), st.sampled_from(["0.5", "1.5", "3.0"]))


def _numeric(inner):
    pair = st.tuples(inner, inner)
    return st.one_of(
        st.tuples(pair, st.sampled_from(["+", "-", "*", "//", "%"])).map(lambda t: f"({t[0][0]} {t[1]} {t[0][1]})"),
        st.tuples(st.sampled_from(["min", "max"]), pair).map(lambda t: f"{t[0]}({t[1][0]}, {t[1][1]})"),
        inner.map(lambda x: f"abs({x})"), inner.map(lambda x: f"round_to({x}, 2)"),
        inner.map(lambda x: f"clamp({x}, 1, 8)"))


NUMERIC = st.recursive(NUMBERS, _numeric, max_leaves=4)
COMPARISONS = st.one_of(
    st.tuples(NUMERIC, st.sampled_from(["<", "<=", ">", ">=", "==", "!="]), NUMERIC).map(" ".join),
    st.sampled_from(["family == 'looped'", "family in ('transformer', 'looped')", "taper_shape != 'cosine'",
                     "exit_gate", "not exit_gate", "num_layers in (1, 2, 3)"]))


def _boolean(inner):
    pair = st.tuples(inner, inner)
    return st.one_of(pair.map(lambda t: f"({t[0]} and {t[1]})"), pair.map(lambda t: f"({t[0]} or {t[1]})"),
                     inner.map(lambda x: f"not ({x})"),
                     st.tuples(inner, inner, inner).map(lambda t: f"({t[0]} if {t[1]} else {t[2]})"))


CONSTRAINTS = st.recursive(COMPARISONS, _boolean, max_leaves=3)


def _mostly(valid):
    """``valid`` five times in six, else any scalar (which the schema mostly refuses)."""
    return st.integers(0, 5).flatmap(lambda i: SCALARS if i == 0 else valid)


AXES = st.fixed_dictionaries({}, optional={
    "num_layers": _mostly(st.one_of(st.integers(1, 4), st.lists(st.integers(1, 4), min_size=1, max_size=3))),
    "loops": _mostly(st.one_of(st.integers(1, 3), st.lists(st.integers(1, 3), min_size=1, max_size=2))),
    "family": _mostly(st.sampled_from(["transformer", "looped", ["transformer", "looped"]])),
    "exit_gate": _mostly(st.sampled_from([False, True, [False, True]])),
    "taper": _mostly(st.fixed_dictionaries({"shape": st.sampled_from(["uniform", "cosine", ["uniform", "reverse"]]),
                                            "ratio": st.sampled_from([2.0, 3.0])})),
})


def test_near_valid_studies_either_plan_or_fail_cleanly(tmp_path):
    """Studies near valid ones (axis values mostly allowed, constraints from the
    grammar) either plan or raise SpecError, and a good share plan: of the 150
    examples at least a quarter plan (52 when written) and at least a tenth fail.
    Fails on the mutation that lets ExprError out of ``expand._evaluate``
    (``except ExprError`` -> ``except KeyError``): a constraint that divides by
    zero or compares None escapes as ExprError instead of SpecError."""
    outcomes = []

    @SETTINGS
    @given(axes=AXES, constraint=CONSTRAINTS)
    def one(axes, constraint):
        tree = {"name": "p", "space": {"axes": {"num_layers": 2, **axes}, "constraints": [constraint]},
                "budget": {"targets": [5e4], "tolerance": 0.05}}
        path = tmp_path / "study.yaml"
        path.write_text(yaml.safe_dump(tree))
        try:
            trials = A.plan(A.load_study(path))
        except A.SpecError:
            outcomes.append(False)
        else:
            assert trials
            outcomes.append(True)

    one()
    assert len(outcomes) == 150
    assert 0.25 <= sum(outcomes) / len(outcomes) <= 0.9, f"{sum(outcomes)} of {len(outcomes)} planned"
