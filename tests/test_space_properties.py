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


@SETTINGS
@given(axes=st.dictionaries(st.sampled_from(["num_layers", "loops", "family", "exit_gate", "taper"]),
                            st.one_of(SCALARS, st.lists(SCALARS, max_size=3)), max_size=4),
       constraint=st.text(max_size=40))
def test_near_valid_studies_either_plan_or_fail_cleanly(tmp_path, axes, constraint):
    tree = {"name": "p", "space": {"axes": {"num_layers": 2, **axes}, "constraints": [constraint]},
            "budget": {"targets": [5e4], "tolerance": 0.05}}
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(tree))
    try:
        A.plan(A.load_study(path))
    except A.SpecError:
        pass
