"""``checks: [causal]``: the study stops before any trial trains when a planned
architecture lets a later token move an earlier output.

Planted leaks: every block adds a little of the next position's hidden state
(a next-token peek), and the memory reading each segment's state after writing
it with that same segment (the mistake papers.md section 2 warns about). Each
stops ``archsearch run`` with exit 2 and one line naming the arm and the
position, and nothing trains. Planted mutation that fails here: comparing the
logits up to t - 1 instead of up to t in ``find_leak`` (a peek at the next
token moves position t only when the tokens after t change; the peek tests fail).
"""

from __future__ import annotations

import textwrap

import pytest
import torch
from typer.testing import CliRunner

import archsearch as A
from archsearch.arch.structures import stack
from archsearch.arch.structures.memory import RecurrentMemory
from archsearch.cli import app
from archsearch.execute.preflight import preflight_checks
from archsearch.inspect.causal import cut_points, find_leak

SPACE = """\
axes:
  family: [transformer, memory]
  num_layers: 2
  memory: {placement: 0, slots: 2, segment: 8}
model:
  head_dim: 8
"""


def study_file(tmp_path, corpus, *, checks: str = "[causal]", sampler: str = "grid"):
    (tmp_path / "space.yaml").write_text(SPACE)
    path = tmp_path / "study.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: gate
        space: space.yaml
        budget: {{targets: [6000], tolerance: 0.05}}
        data: {{kind: text, paths: [{corpus}], seq_len: 16}}
        recipe: {{steps: 2, batch_size: 2, warmup_steps: 1, eval_every: 2, eval_batches: 1}}
        seeds: [0, 1]
        search: {{sampler: {sampler}{", trials: 2" if sampler != "grid" else ""}}}
        checks: {checks}
        """))
    return path


def peek_next_token(monkeypatch):
    forward = stack.Layer.forward

    def peeking(self, x_BTD):
        ahead_BTD = torch.cat([x_BTD[:, 1:], torch.zeros_like(x_BTD[:, :1])], dim=1)
        return forward(self, x_BTD) + 1e-3 * ahead_BTD

    monkeypatch.setattr(stack.Layer, "forward", peeking)


def read_after_write(monkeypatch):
    def segment_states(self, hn_BTD, start_BMS=None):
        state_BMS, states = self.initial_MS.repeat(hn_BTD.shape[0], 1, 1), []
        for start in range(0, hn_BTD.shape[1], self.segment):
            state_BMS = self.write(state_BMS, hn_BTD[:, start:start + self.segment])
            states.append(state_BMS)  # segment k reads S_{k+1}: the state written with it
        return torch.stack(states, dim=1)

    monkeypatch.setattr(RecurrentMemory, "segment_states", segment_states)


@pytest.mark.parametrize("plant,arm,position", [
    (peek_next_token, "family=transformer", "after position 0 moved its logits at position 0"),
    (read_after_write, "family=memory", "after position 0 moved its logits at position 0"),
], ids=["next-token-peek", "memory-reads-after-writing"])
def test_a_leak_stops_the_study_before_training(tmp_path, corpus, monkeypatch, plant, arm, position):
    study = study_file(tmp_path, corpus)
    store = tmp_path / "s.duckdb"
    plant(monkeypatch)
    result = CliRunner().invoke(app, ["run", str(study), "--store", str(store), "--no-progress"])
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith(f"error: {study}:") and "checks: causal-leakage check failed: arm " + arm in line
    assert f"changing the tokens {position}" in line and "no trial was trained" in line
    with A.open_store(store, read_only=True) as db:
        assert set(db.trials("gate").column("status").to_pylist()) == {"planned"}
        assert db.metrics("gate").num_rows == 0
        (check,) = db.checks("gate")
    assert not check["passed"] and check["failure"] in line
    status = CliRunner().invoke(app, ["status", "--store", str(store)])
    assert "causal-leakage check of gate" in status.output and "FAILED: causal-leakage check failed" in status.output


def test_causal_models_pass_and_status_says_the_check_ran(tmp_path, corpus):
    study = A.load_study(study_file(tmp_path, corpus))
    store = tmp_path / "s.duckdb"
    with A.open_store(store) as db:
        db.add_study(name="gate", path="study.yaml", config={})
        preflight_checks(study, db)  # raises on a leak
        (check,) = db.checks("gate")
    # two architectures (the seeds share them): the transformer at the training length,
    # the memory at 3 segments of 8 tokens
    assert check["passed"] and check["architectures"] == 2 and check["seq_len"] == [16, 24]
    out = CliRunner().invoke(app, ["status", "--store", str(store)]).output
    assert "causal-leakage check of gate" in out and "passed on 2 architectures at 16, 24 tokens" in out


def test_without_the_key_nothing_is_checked(tmp_path, corpus, monkeypatch):
    peek_next_token(monkeypatch)
    study = A.load_study(study_file(tmp_path, corpus, checks="[]"))
    with A.open_store(tmp_path / "s.duckdb") as db:
        preflight_checks(study, db)
        assert db.checks() == []


def test_the_key_is_refused_where_the_architectures_are_not_known(tmp_path, corpus):
    with pytest.raises(A.SpecError, match=r"study.yaml:\d+: checks: .*random search's are not known"):
        A.load_study(study_file(tmp_path, corpus, sampler="random"))
    with pytest.raises(A.SpecError, match=r"study.yaml:\d+: checks\[0\]: .*'causal'"):
        A.load_study(study_file(tmp_path, corpus, checks="[casual]"))


def test_cuts_are_every_position_of_a_short_sequence_and_each_side_of_a_segment_boundary():
    assert cut_points(24, 8) == list(range(23))
    assert cut_points(256, 64) == [0, 63, 64, 96, 127, 128, 160, 192, 254]
    assert cut_points(256) == [0, 64, 128, 192, 254]


class PeekAt(torch.nn.Module):
    """Logits [B, T, V] of one-hot tokens, except that position ``at`` also reads the token after it."""

    def __init__(self, at: int):
        super().__init__()
        self.at = at

    def forward(self, tokens_BT):
        logits_BTV = torch.nn.functional.one_hot(tokens_BT, 10).double()
        logits_BTV[:, self.at] += tokens_BT[:, self.at + 1, None].double()
        return logits_BTV


@pytest.mark.parametrize("at", [0, 5, 10])
def test_a_leak_at_one_position_is_found_there(at):
    leak = find_leak(PeekAt(at), vocab_size=10, seq_len=12)
    assert (leak.position, leak.after) == (at, at) and leak.moved >= 1
    assert "after position %d moved its logits at position %d" % (at, at) in leak.describe()


@pytest.mark.ray
@pytest.mark.slow
def test_a_causal_study_runs_after_its_check(tmp_path, corpus):
    study = study_file(tmp_path, corpus)
    store = tmp_path / "s.duckdb"
    result = CliRunner().invoke(app, ["run", str(study), "--store", str(store), "--no-progress",
                                      "--report", str(tmp_path / "r.html")])
    assert result.exit_code == 0, result.output
    with A.open_store(store, read_only=True) as db:
        assert set(db.trials("gate").column("status").to_pylist()) == {"completed"}
        (check,) = db.checks("gate")
    assert check["passed"] and check["architectures"] == 2
    out = CliRunner().invoke(app, ["status", "--store", str(store)]).output
    assert "causal-leakage check of gate" in out and "passed on 2 architectures" in out
