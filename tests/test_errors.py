"""Bad files end in one line naming file, line and field; exit 2; no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TINY_SPACE, tiny_study_text

CASES = {
    # name: (edit to the study text, edit to the space text, expected line, expected text)
    "unknown-key": (("recipe:", "recipe:\n  stepz: 3"), None, "recipe.stepz", "did you mean 'steps'"),
    "wrong-type": (("batch_size: 4", "batch_size: four"), None, "recipe.batch_size", "integer"),
    "unknown-shape": (None, ("shape: [uniform, cosine, reverse]", "shape: [uniform, cosin]"),
                      "axes.taper.shape[1]", "did you mean 'cosine'"),
    "impossible-budget": (("targets: [6000]", "targets: [6000, 10]"), None, "budget.targets[1]",
                          "below the smallest model"),
    "negative-target": (("targets: [6000]", "targets: [-5]"), None, "budget.targets[0]", "greater than 0"),
    "wrong-layers-type": (None, ("num_layers: 2", "num_layers: two"), "axes.num_layers", "integer"),
    "missing-budget": (("budget:\n  targets: [6000]\n  tolerance: 0.02\n", ""), None, "budget",
                       "required key is missing"),
    "unknown-data-kind": (("kind: text", "kind: txt"), None, "data.kind", "did you mean 'text'"),
    "duplicate-key": (("name: tiny", "name: tiny\nname: again"), None, "name", "duplicate key"),
    "yaml-syntax": (("name: tiny", "name: [tiny"), None, None, "YAML syntax error"),
}


def write(tmp_path: Path, corpus: Path, study_edit, space_edit) -> Path:
    study, space = tiny_study_text(corpus=corpus), TINY_SPACE
    if study_edit:
        assert study_edit[0] in study
        study = study.replace(*study_edit)
    if space_edit:
        assert space_edit[0] in space
        space = space.replace(*space_edit)
    (tmp_path / "space.yaml").write_text(space)
    (tmp_path / "study.yaml").write_text(study)
    return tmp_path / "study.yaml"


def run_cli(*args: str, separate_process: bool = False) -> subprocess.CompletedProcess:
    """The CLI's exit code and stderr; in-process unless asked (a real process
    proves no traceback escapes; in-process keeps the corpus fast)."""
    if separate_process:
        return subprocess.run([sys.executable, "-m", "archsearch.cli", *args], capture_output=True, text=True,
                              timeout=120)
    from typer.testing import CliRunner

    from archsearch.cli import app

    result = CliRunner().invoke(app, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_bad_file_is_one_clear_line(tmp_path, corpus, case):
    study_edit, space_edit, field, text = case
    path = write(tmp_path, corpus, study_edit, space_edit)
    result = run_cli("plan", str(path), separate_process=case is CASES["unknown-shape"])
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    expected_file = "space.yaml" if space_edit else "study.yaml"
    assert expected_file in lines[0] and text in lines[0]
    assert f"{expected_file}:" in lines[0] and lines[0].split(f"{expected_file}:")[1][0].isdigit()
    if field:
        assert field in lines[0]


def test_the_line_number_points_at_the_bad_field(tmp_path, corpus):
    path = write(tmp_path, corpus, ("batch_size: 4", "batch_size: four"), None)
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if "batch_size" in text)
    assert f"study.yaml:{line}:" in run_cli("plan", str(path)).stderr


@pytest.mark.parametrize("kind", ["directory", "binary", "missing", "not-a-mapping", "alias-bomb"])
def test_files_that_are_not_studies(tmp_path, kind):
    path = tmp_path / "study.yaml"
    if kind == "directory":
        path.mkdir()
    elif kind == "binary":
        path.write_bytes(b"\x00\x01\x02name: x")
    elif kind == "not-a-mapping":
        path.write_text("- just\n- a list\n")
    elif kind == "alias-bomb":
        levels = ['a: &a ["x","x","x","x","x","x","x","x","x"]']
        levels += [f"{c}: &{c} [*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p}]" for p, c in zip("abcdefgh", "bcdefghi")]
        path.write_text("\n".join(levels) + "\n")
    result = run_cli("plan", str(path))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "study.yaml" in result.stderr
