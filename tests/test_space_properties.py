"""Property tests: no input crashes or hangs the study loader.

Whatever bytes or YAML structure a user hands in, loading either returns a
study or raises SpecError: never another exception.
"""

from __future__ import annotations

import yaml
from hypothesis import HealthCheck, example, given, settings
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

# No deadline: a loaded machine can stall any example past one; a hang shows as a run that never ends.
SETTINGS = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# The positive control of each fuzzer: a study that loads, among its examples, must load (a loader
# that refused everything in one SpecError would otherwise pass every fuzzer here).
VALID_TREE = {"name": "p", "space": {"axes": {"num_layers": 2}}, "budget": {"targets": [5e4], "tolerance": 0.05}}


def load(path) -> A.Study | None:
    """The study, or None where loading refused it in a SpecError (any other exception fails)."""
    try:
        return A.load_study(path)
    except A.SpecError:
        return None


@SETTINGS
@example(data=yaml.safe_dump(VALID_TREE).encode())
@given(data=st.binary(max_size=400))
def test_arbitrary_bytes_never_crash(tmp_path, data):
    path = tmp_path / "study.yaml"
    path.write_bytes(data)
    study = load(path)
    if data == yaml.safe_dump(VALID_TREE).encode():
        assert study is not None and study.name == "p"


@SETTINGS
@example(tree=VALID_TREE)
@given(tree=TREES)
def test_arbitrary_yaml_structures_never_crash(tmp_path, tree):
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(tree))
    study = load(path)
    if tree == VALID_TREE:
        assert study is not None and study.name == "p"


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


# The hostile shapes of tests/hostile/, drawn: deep nesting, quoted and huge
# numbers, include graphs. Each either loads or fails as one SpecError.

NESTERS = {"list": ("[", "]"), "map": ("{a: ", "}"), "block": None}


def nested_text(kind: str, depth: int) -> str:
    if kind == "block":  # indented block mappings, one level a line
        return "".join(f"{'  ' * i}k{i}:\n" for i in range(depth)) + "  " * depth + "v: 1\n"
    opener, closer = NESTERS[kind]
    return "name: deep\nspace: " + opener * depth + "1" + closer * depth + "\n"


@settings(SETTINGS, max_examples=40)
@given(kind=st.sampled_from(sorted(NESTERS)), depth=st.integers(1, 20_000))
def test_nesting_of_any_depth_is_read_or_refused_cleanly(tmp_path, kind, depth):
    from archsearch.space._yaml import MAX_DEPTH

    depth = depth if kind != "block" else depth % 800  # indentation grows the file with the square of depth
    path = tmp_path / "study.yaml"
    path.write_text(nested_text(kind, depth))
    try:
        A.load_study(path)
    except A.SpecError as err:
        if depth + 1 > MAX_DEPTH:
            assert "nest deeper than" in str(err) or "indentation" in str(err) or "larger than" in str(err)


NUMERIC_FIELDS = {  # dotted path in a study -> a valid value
    ("space", "axes", "num_layers"): 2, ("space", "axes", "loops"): 2, ("recipe", "steps"): 10,
    ("recipe", "batch_size"): 4, ("recipe", "lr"): 0.003, ("recipe", "warmup_steps"): 1,
    ("budget", "tolerance"): 0.05, ("execution", "threads_per_trial"): 1, ("execution", "retries"): 1,
    ("space", "model", "head_dim"): 8, ("space", "axes", "taper", "ratio"): 2.0, ("data", "seq_len"): 16,
}


def study_with(at: tuple, value) -> dict:
    tree = {"name": "p", "space": {"axes": {"num_layers": 2}}, "budget": {"targets": [5e4], "tolerance": 0.05},
            "data": {"kind": "text"}}
    node = tree
    for part in at[:-1]:
        node = node.setdefault(part, {})
    node[at[-1]] = value
    return tree


@SETTINGS
@given(at=st.sampled_from(sorted(NUMERIC_FIELDS)))
def test_a_quoted_number_is_refused_in_every_numeric_field(tmp_path, at):
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study_with(at, NUMERIC_FIELDS[at])))
    A.load_study(path)  # the unquoted value loads
    path.write_text(yaml.safe_dump(study_with(at, str(NUMERIC_FIELDS[at]))))
    try:
        A.load_study(path)
    except A.SpecError as err:
        assert "without quotes" in str(err) and ".".join(at) in str(err), err
    else:
        raise AssertionError(f"{'.'.join(at)}: a quoted number was accepted")


@SETTINGS
@given(at=st.sampled_from(sorted(NUMERIC_FIELDS) + [("seeds",), ("budget", "targets")]),
       value=st.one_of(st.integers(-10**30, 10**30), st.floats(allow_nan=True)))
def test_any_number_anywhere_loads_within_limits_or_fails_cleanly(tmp_path, at, value):
    path = tmp_path / "study.yaml"
    written = [value] if at in (("seeds",), ("budget", "targets")) else value
    path.write_text(yaml.safe_dump(study_with(at, written)))
    try:
        study = A.load_study(path)
    except A.SpecError:
        return
    # what loads fits what stores and workers take: INTEGER seeds, a bounded recipe
    assert all(0 <= seed < 2**31 for seed in study.seeds)
    assert study.recipe.steps <= 10**9 and study.execution.threads_per_trial <= 1024


@settings(SETTINGS, max_examples=60)
@given(edges=st.lists(st.lists(st.integers(0, 5), max_size=6), min_size=6, max_size=6))
def test_any_include_graph_loads_or_fails_cleanly(tmp_path, edges):
    """Six files including each other at random: cycles, diamonds, fan-outs, self-includes."""
    for index, targets in enumerate(edges):
        lines = [f"include: [{', '.join(f'f{t}.yaml' for t in targets)}]"] if targets else []
        (tmp_path / f"f{index}.yaml").write_text("\n".join(lines + [f"k{index}: 1", ""]))
    (tmp_path / "study.yaml").write_text("include: f0.yaml\nname: p\nspace:\n  axes:\n    num_layers: 2\n"
                                         "budget:\n  targets: [5e4]\n")
    try:
        A.load_study(tmp_path / "study.yaml")
    except A.SpecError:
        pass
