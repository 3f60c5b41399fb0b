"""Work that passes validation and cannot run: `plan` estimates each trial's peak training
memory (budget.memory), counts evaluation in the study's FLOPs, and refuses a trial whose
estimate exceeds ``execution.memory`` or the machine's memory, in one line naming the trial
and the estimate by part (``--ignore-memory`` overrides). The estimate is held to measured
peak resident memory within a factor of 2 (the slow test below)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

import archsearch as A
from archsearch.budget.memory import estimate_memory
from archsearch.cli import app
from tests.test_hostile_files import assert_one_clean_line, run_limited

# the estimate is within this factor of the measured peak, either way
FACTOR = 2.0


def study_file(tmp_path: Path, corpus: Path, *, family: str = "transformer") -> Path:
    """A 4-layer model of 200k parameters, 32 rows of 256 bytes a step; tests change it by --set."""
    (tmp_path / "space.yaml").write_text(f"name: memspace\naxes:\n  family: [{family}]\n  num_layers: 4\n")
    path = tmp_path / "study.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: mem
        space: space.yaml
        budget: {{targets: [200000], tolerance: 0.05}}
        data: {{kind: text, paths: [{corpus}], seq_len: 256}}
        recipe: {{steps: 2, batch_size: 32, warmup_steps: 1, eval_every: 2, eval_batches: 1}}
        execution: {{max_parallel: 1}}
        """))
    return path


def sets(*overrides: str) -> list[str]:
    return [part for text in overrides for part in ("--set", text)]


def test_a_batch_that_cannot_fit_is_refused_naming_trial_and_estimate(tmp_path, corpus):
    """batch_size 4096 x seq_len 65536: terabytes of activations and logits a step."""
    study = study_file(tmp_path, corpus)
    huge = ["recipe.batch_size=4096", "data.seq_len=65536"]
    code, stderr = run_limited("plan", str(study), *sets(*huge))
    trial = A.plan(A.load_study(study, overrides=[*huge, "execution.memory_check=false"]))[0]
    line = assert_one_clean_line(code, stderr, expect=f"trial {trial.trial_id} (family=transformer",
                                 name="recipe.batch_size=4096", field="recipe.batch_size", line_number=False)
    assert "needs about 7.11 TB at its training peak (weights" in line and "logits 825 GB" in line, line
    assert "--ignore-memory" in line and "this machine's memory" in line
    result = CliRunner().invoke(app, ["plan", str(study), *sets(*huge), "--ignore-memory", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)[0]["peak_memory"]["total"] == trial.memory.total > 7e12


def test_execution_memory_is_the_limit_when_given(tmp_path, corpus):
    study = study_file(tmp_path, corpus)
    code, stderr = run_limited("plan", str(study), *sets("execution.memory=100MB"))
    line = assert_one_clean_line(code, stderr, expect="more than the 100 MB of execution.memory",
                                 name="study.yaml:5", field="recipe.batch_size")
    assert "needs about 221 MB" in line
    # a quarter of the batch at once
    assert run_limited("plan", str(study), *sets("execution.memory=100MB", "recipe.grad_accum=4"))[0] == 0


def test_the_plan_shows_the_estimate_and_counts_evaluation(tmp_path, corpus):
    study = study_file(tmp_path, corpus)
    changes = ["recipe.steps=10", "recipe.eval_every=4", "recipe.eval_batches=3"]
    trial = A.plan(A.load_study(study, overrides=changes))[0]
    # evaluations at steps 4, 8 and 10, three batches of 32 x 256 tokens each, forward only
    assert trial.eval_flops == pytest.approx(3 * 3 * 32 * 256 * A.flops_per_token(trial.spec, seq_len=256,
                                                                                    kind="forward"))
    result = CliRunner().invoke(app, ["plan", str(study), *sets(*changes)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "memory" in result.output and "221 MB" in result.output
    assert f"total FLOPs: {trial.train_flops + trial.eval_flops:.3g} = training {trial.train_flops:.3g}" \
        in " ".join(result.output.split())


def test_eval_batches_is_bounded(tmp_path, corpus):
    study = study_file(tmp_path, corpus)
    code, stderr = run_limited("plan", str(study), *sets("recipe.eval_batches=1000000000"))
    assert_one_clean_line(code, stderr, expect="less than or equal to 100000", name="recipe.eval_batches",
                          field="recipe.eval_batches", line_number=False)


def test_a_huge_vocabulary_on_a_small_model_is_said(tmp_path, corpus):
    """A BPE vocabulary of 2^20 on a 200k-parameter model: 67M parameters, nearly all in
    embeddings; the plan says so, and its estimate counts them."""
    study = study_file(tmp_path, corpus)
    changes = ["data.tokenizer=bpe", "data.vocab_size=1048576", "recipe.batch_size=1", "execution.memory=1TB"]
    trial = A.plan(A.load_study(study, overrides=changes))[0]
    assert trial.total_params > 300 * trial.params  # 67M parameters, 99.7% of them embeddings
    assert trial.memory.weights + trial.memory.optimizer == 16 * trial.total_params
    result = CliRunner().invoke(app, ["plan", str(study), *sets(*changes)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert f"note: embeddings hold 100% of trial {trial.trial_id}'s" in " ".join(result.output.split())


def test_the_parts_scale_as_stated():
    from archsearch.arch.spec import ArchSpec, LayerSpec

    spec = ArchSpec(family="transformer", vocab_size=256, d_model=64, num_heads=4,
                    layers=tuple(LayerSpec(mlp_width=176) for _ in range(4)))
    one = estimate_memory(spec, batch_size=8, grad_accum=1, seq_len=128)
    assert estimate_memory(spec, batch_size=16, grad_accum=1, seq_len=128).activations == 2 * one.activations
    assert estimate_memory(spec, batch_size=16, grad_accum=2, seq_len=128).activations == one.activations
    assert one.weights == one.optimizer == 8 * A.count_params(spec, embeddings=True)
    assert one.activations == 4 * 8 * 128 * 4 * (12 * 64 + 4 * 176)
    assert one.logits == 4 * 3 * 8 * 128 * 256


MEASURE = textwrap.dedent("""\
    import json, sys
    import torch
    import archsearch as A
    from archsearch.data import make_source
    from archsearch.train import train_trial

    def status(field: str) -> int:  # bytes, from /proc/self/status
        line = next(l for l in open("/proc/self/status") if l.startswith(field + ":"))
        return int(line.split()[1]) * 1024

    study = A.load_study(sys.argv[1], overrides=sys.argv[2:])
    trial = A.plan(study)[0]
    source = make_source(trial.data)
    torch.set_num_threads(1)
    x = torch.randn(64, 64, requires_grad=True)
    (x @ x).sum().backward()  # torch's first autograd and allocator work, before the baseline
    # the peak from here on: whatever the process held at its peak before (loading, planning) is not
    # the training's (writing 5 to clear_refs resets VmHWM to the current resident size)
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")
    before = status("VmRSS")
    train_trial(spec=trial.spec, recipe=trial.recipe, data=source, seed=0, threads=1)
    print(json.dumps(dict(estimate=trial.memory.total, measured=status("VmHWM") - before)))
    """)

# trials large enough that the runtime's own first-use memory (about 0.2 GB) is a small part
MEASURED = {
    "transformer-activations": ("transformer", ["recipe.batch_size=64", "data.seq_len=512"]),
    "transformer-weights": ("transformer", ["budget.targets=[2.0e+7]", "recipe.batch_size=2", "data.seq_len=64"]),
    "gated-deltanet": ("gdn", ["recipe.batch_size=48"]),
    "mamba2": ("mamba2", ["recipe.batch_size=32"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(MEASURED))
def test_the_estimate_is_within_a_factor_of_2_of_the_measured_peak(case, tmp_path, corpus):
    family, overrides = MEASURED[case]
    study = study_file(tmp_path, corpus, family=family)
    script = tmp_path / "measure.py"
    script.write_text(MEASURE)
    done = subprocess.run([sys.executable, str(script), str(study), *overrides], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    numbers = json.loads(done.stdout.strip().splitlines()[-1])
    ratio = numbers["measured"] / numbers["estimate"]
    assert 1 / FACTOR <= ratio <= FACTOR, numbers
