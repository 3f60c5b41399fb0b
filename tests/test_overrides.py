"""``--set KEY=VALUE``: a study run on other data or settings without editing
it, validated like the file, errors naming the override."""

from __future__ import annotations

import json
import textwrap

import pytest

import archsearch as A


@pytest.fixture
def study(tmp_path):
    (tmp_path / "space.yaml").write_text("name: s\naxes:\n  family: transformer\n  num_layers: [1, 2]\n"
                                         "model: {head_dim: 8}\n")
    path = tmp_path / "study.yaml"
    path.write_text(textwrap.dedent("""\
        name: o
        space: space.yaml
        budget: {targets: [20000], tolerance: 0.05}
        recipe: {steps: 200, batch_size: 4}
        """))
    return path


def test_overrides_replace_values_of_the_study_and_its_space(study):
    loaded = A.load_study(study, overrides=["recipe.steps=7", "seeds=[0, 1]", "space.axes.num_layers=[3]",
                                            "budget.targets=[30000, 40000]"])
    assert loaded.recipe.steps == 7 and loaded.seeds == [0, 1]
    trials = A.plan(loaded)
    assert {t.spec.num_layers for t in trials} == {3} and len(trials) == 4


def test_data_paths_from_the_command_line_are_relative_to_the_current_folder(study, tmp_path, monkeypatch):
    corpus = tmp_path / "elsewhere" / "wiki.txt"
    corpus.parent.mkdir()
    corpus.write_text("some text " * 100)
    monkeypatch.chdir(corpus.parent)
    loaded = A.load_study(study, overrides=["data.paths=[wiki.txt]"])
    assert loaded.data.paths == [str(corpus.resolve())]


@pytest.mark.parametrize("override, message", [
    ("recipe.steps=many", "--set recipe.steps=many: recipe.steps: "),
    ('recipe.steps="50"', "write the number without quotes"),
    ("recipe.stepz=5", "unknown key 'stepz'"),
    ("recipe.steps", "--set takes KEY=VALUE"),
    ("recipe.steps.x=5", "is not a section"),
    ("space.axes.num_layers=[0]", "--set space.axes.num_layers=[0]: "),
    ("recipe.steps=[1, 2", "not a YAML value"),
])
def test_a_bad_override_fails_in_one_line_naming_it(study, override, message):
    from tests.test_errors import run_cli

    with pytest.raises(A.SpecError) as caught:
        A.plan(A.load_study(study, overrides=[override]))
    assert message in str(caught.value) and "\n" not in str(caught.value), str(caught.value)


def test_plan_takes_set_on_the_command_line(study):
    from tests.test_errors import run_cli

    result = run_cli("plan", str(study), "--json", "--set", "space.axes.num_layers=[3]", "--set", "seeds=[4]")
    assert result.returncode == 0, result.stderr
    trials = json.loads(result.stdout)
    assert [(t["num_layers"], t["seed"]) for t in trials] == [(3, 4)]
    bad = run_cli("plan", str(study), "--set", "recipe.steps=lots")
    assert bad.returncode == 2 and bad.stderr.startswith("error: --set recipe.steps=lots: recipe.steps: ")
