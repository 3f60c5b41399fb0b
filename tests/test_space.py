"""The space language: conditions, family relevance, derived values,
constraints, ranges, ladders, include, and the JSON Schema."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

import archsearch as A
from archsearch.errors import SpecError
from archsearch.space.expand import expand

ROOT = Path(__file__).resolve().parents[1]


def space_of(tmp_path: Path, axes: str, extra: str = ""):
    text = "name: s\naxes:\n" + textwrap.indent(textwrap.dedent(axes), "  ") + textwrap.dedent(extra)
    path = tmp_path / "space.yaml"
    path.write_text(text)
    return A.load_space(path)


def test_axes_a_family_does_not_read_are_dropped(tmp_path):
    points = expand(space_of(tmp_path, "family: [transformer, looped]\nnum_layers: 2\nloops: [1, 2, 3]\n"))
    transformer = [p for p in points if p["family"] == "transformer"]
    looped = [p for p in points if p["family"] == "looped"]
    assert len(transformer) == 1 and "loops" not in transformer[0]
    assert sorted(p["loops"] for p in looped) == [1, 2, 3]


def test_when_keeps_an_axis_only_where_it_holds(tmp_path):
    space = space_of(tmp_path, """\
        family: looped
        num_layers: [2, 4]
        exit_gate: {values: [true, false], when: "num_layers > 2"}
        """)
    points = expand(space)
    assert sum("exit_gate" in p for p in points) == 2 and len(points) == 3


def test_derived_values_set_axes_and_feed_constraints(tmp_path):
    space = space_of(tmp_path, "family: looped\nnum_layers: 1\nloops: [1, 2, 3, 4, 6]\n", """\
        derived:
          num_layers: "12 // loops"
          depth: "num_layers * loops"
        constraints:
          - "depth == 12"
          - "loops != 4"
        """)
    points = expand(space)
    assert [(p["loops"], p["num_layers"]) for p in points] == [(1, 12), (2, 6), (3, 4), (6, 2)]
    assert all(p["depth"] == 12 for p in points)


def test_ranges_grid_and_sample_are_typed_and_seeded(tmp_path):
    grid = expand(space_of(tmp_path, "num_layers: {low: 2, high: 32, log: true, grid: 5}\n"))
    assert [p["num_layers"] for p in grid] == [2, 4, 8, 16, 32]
    axes = "num_layers: 2\ntaper:\n  shape: cosine\n  ratio: {low: 1.5, high: 4.0, sample: 4}\n"
    first = [p["taper.ratio"] for p in expand(space_of(tmp_path, axes))]
    again = [p["taper.ratio"] for p in expand(space_of(tmp_path, axes))]
    other = [p["taper.ratio"] for p in expand(space_of(tmp_path, axes, "seed: 7\n"))]
    assert first == again != other
    assert len(first) == 4 and all(1.5 <= r <= 4.0 for r in first)


def test_a_ladder_is_geometric():
    from archsearch.space.schema import Budget

    targets = Budget(targets={"start": 1e4, "stop": 1e6, "count": 3}).target_list()
    assert targets == pytest.approx([1e4, 1e5, 1e6])


def test_include_reuses_a_space_and_overrides_parts(tmp_path):
    (tmp_path / "base.yaml").write_text("name: base\naxes:\n  num_layers: [2, 4]\n  taper:\n    shape: cosine\n")
    (tmp_path / "child.yaml").write_text("include: base.yaml\nname: child\naxes:\n  num_layers: 6\n")
    space = A.load_space(tmp_path / "child.yaml")
    assert space.name == "child"
    assert [(p["num_layers"], p["taper.shape"]) for p in expand(space)] == [(6, "cosine")]


def test_errors_in_an_included_file_name_that_file(tmp_path):
    (tmp_path / "base.yaml").write_text("name: base\naxes:\n  num_layers: 2\n  taper:\n    shape: cosin\n")
    (tmp_path / "child.yaml").write_text("include: base.yaml\nname: child\n")
    with pytest.raises(SpecError) as err:
        A.load_space(tmp_path / "child.yaml")
    assert err.value.path.endswith("base.yaml") and err.value.line == 5


def test_schema_covers_every_shipped_file():
    jsonschema = pytest.importorskip("jsonschema")
    import yaml

    from archsearch.space.schema import Space, Study

    schemas = {"spaces": Space.model_json_schema(), "studies": Study.model_json_schema()}
    files = [(folder, path) for folder in schemas for path in sorted((ROOT / folder).glob("*.yaml"))]
    assert len(files) >= 2
    for folder, path in files:
        jsonschema.validate(yaml.safe_load(path.read_text()), schemas[folder])


def test_schema_command_prints_json_schema():
    from typer.testing import CliRunner

    from archsearch.cli import app

    for kind in ("study", "space"):
        result = CliRunner().invoke(app, ["schema", kind])
        assert result.exit_code == 0
        assert "properties" in json.loads(result.stdout)


def test_constraints_can_guard_on_axes_other_families_lack(tmp_path):
    space = space_of(tmp_path, "family: [transformer, looped]\nnum_layers: 2\nloops: [1, 2]\n",
                     'constraints:\n  - "family != \'looped\' or loops > 1"\n')
    assert [(p["family"], p.get("loops")) for p in expand(space)] == [("transformer", None), ("looped", 2)]
