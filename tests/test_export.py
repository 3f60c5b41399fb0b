"""`archsearch export --hf`: trained trials out as transformers checkpoints that compute the same
logits, and every other model as safetensors plus the spec that rebuilds it."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

import archsearch as A
from archsearch.arch.spec import ArchSpec, LayerSpec
from archsearch.cli import app
from archsearch.store import checkpoint_dir
from archsearch.train.checkpoint import save_final

transformers = pytest.importorskip("transformers")

MAMBA = {"d_state": 8, "d_conv": 3, "dt_rank": 3}
MAMBA2 = {"d_state": 8, "head_dim": 8, "n_groups": 2, "chunk_size": 8}
SPECS = {
    # d_model 24 over 3 heads of 8: a head dim that is not the width, MLP width 40 not a power of two
    "llama_tied": ArchSpec(family="transformer", vocab_size=61, d_model=24, num_heads=3,
                           layers=(LayerSpec(mlp_width=40),) * 2, rope_theta=500.0),
    "llama_untied": ArchSpec(family="transformer", vocab_size=61, d_model=24, num_heads=3, tie_embeddings=False,
                             layers=(LayerSpec(mlp_width=40),) * 2, norm_eps=1e-5),
    "mamba": ArchSpec(family="mamba", vocab_size=61, d_model=24, num_heads=3,
                      layers=(LayerSpec(mixer="mamba", mlp="none", options=MAMBA),) * 2),
    "mamba2": ArchSpec(family="mamba2", vocab_size=61, d_model=24, num_heads=3, tie_embeddings=False,
                       layers=(LayerSpec(mixer="mamba2", mlp="none", options=MAMBA2),) * 2),
    # not transformers models: tapered widths, a looped structure, a Mamba with MLPs
    "tapered": ArchSpec(family="transformer", vocab_size=61, d_model=24, num_heads=3,
                        layers=(LayerSpec(mlp_width=48), LayerSpec(mlp_width=32))),
    "looped": ArchSpec(family="looped", vocab_size=61, d_model=24, num_heads=3, structure="looped",
                       options={"loops": 2, "exit_gate": False, "inject": True}, layers=(LayerSpec(mlp_width=40),)),
    "mamba_mlp": ArchSpec(family="mamba", vocab_size=61, d_model=24, num_heads=3,
                          layers=(LayerSpec(mixer="mamba", mlp="swiglu", mlp_width=40, options=MAMBA),) * 2),
}
HF = {"llama_tied": "LlamaForCausalLM", "llama_untied": "LlamaForCausalLM", "mamba": "MambaForCausalLM",
      "mamba2": "Mamba2ForCausalLM"}


def randomized(spec: ArchSpec, seed: int) -> torch.nn.Module:
    """The model of ``spec`` with every weight random: norms and D away from one, A_log and
    dt_bias off their init, so a weight moved to the wrong place changes the logits."""
    torch.manual_seed(seed)
    model = A.build_model(spec)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("norm.weight", "norm_weight", ".D")):
                param.copy_(1 + 0.3 * torch.randn_like(param))
            elif name.endswith(("A_log", "dt_bias")):
                param.copy_(torch.randn_like(param) * 0.5 - 1)
            else:
                param.copy_(torch.randn_like(param) * param.shape[-1] ** -0.5)
    return model.eval()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One trial per spec, its random model saved as training saves a finished trial."""
    path = tmp_path_factory.mktemp("export") / "s.duckdb"
    rows = []
    for seed, (name, spec) in enumerate(SPECS.items()):
        save_final(checkpoint_dir(path, f"{name}-trial"), model=randomized(spec, seed), spec=spec)
        rows.append(dict(trial_id=f"{name}-trial", spec=spec.to_dict(), axes={}, seed=0, match="params",
                         target=0.0, params=A.count_params(spec), total_params=A.count_params(spec),
                         flops_per_token=0.0, match_error=0.0, d_model=spec.d_model, num_layers=spec.num_layers,
                         recipe={}, data={"kind": "text", "seq_len": 32}))
    rows.append(dict(rows[0], trial_id="untrained"))
    with A.open_store(path) as db:
        db.add_study(name="s", path="s.yaml", config={})
        db.add_trials("s", rows)
        for row in rows[:-1]:
            db.finish(row["trial_id"], dict(train_loss=1.0, val_loss=1.0, val_accuracy=0.0, steps=1, tokens=1,
                                            wall_time_s=1.0, tokens_per_s=1.0, curve=[]))
    return path


def export(store, *args: str):
    return CliRunner().invoke(app, ["export", *args, "--store", str(store)])


@pytest.mark.parametrize("name", sorted(HF))
def test_a_transformers_checkpoint_gives_archsearchs_logits(store, tmp_path, name):
    """Fails if any weight lands in the wrong place (a swapped gate and up, q and k rows
    interleaved for another rotary layout, Mamba's dt bias or conv left out, an untied head)."""
    from archsearch.inspect import load_trained

    out = tmp_path / "hf"
    # a unique prefix of the id names the trial
    result = export(store, "--hf", f"{name}-", str(out))
    assert result.exit_code == 0, result.output
    assert HF[name] in result.output
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [HF[name]]
    assert any(p.suffix == ".safetensors" for p in out.iterdir())

    hf_model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(hf_model).__name__ == HF[name]
    ours = load_trained(f"{name}-trial", store=store)
    # 19 steps: several Mamba-2 chunks of 8 and a last one cut short
    tokens_BT = torch.randint(0, 61, (3, 19), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours_BTV, theirs_BTV = ours(tokens_BT), hf_model(tokens_BT).logits
    assert ours_BTV.abs().max() > 1.0  # logits large enough that a misplaced weight shows
    assert (ours_BTV - theirs_BTV).abs().max().item() < 1e-4


@pytest.mark.parametrize("name, reason", [("tapered", "MLP widths differ by layer (32, 48)"),
                                          ("looped", "structure is 'looped'"),
                                          ("mamba_mlp", "mamba layers have a swiglu MLP")])
def test_other_models_are_written_as_safetensors_and_the_spec_that_rebuilds_them(store, tmp_path, name, reason):
    from safetensors.torch import load_model

    from archsearch.inspect import load_trained

    out = tmp_path / "native"
    result = export(store, "--hf", f"{name}-trial", str(out))
    assert result.exit_code == 0, result.output
    assert "not a transformers checkpoint" in result.output and reason in result.output
    assert "newest checkpoint" not in result.output  # a completed trial: its final model
    assert not (out / "config.json").exists()
    rebuilt = A.build_model(ArchSpec.from_dict(json.loads((out / "spec.json").read_text())))
    load_model(rebuilt, str(out / "model.safetensors"))
    tokens_BT = torch.randint(0, 61, (2, 11), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(rebuilt.eval()(tokens_BT), load_trained(f"{name}-trial", store=store)(tokens_BT))


def test_user_errors_are_one_line_and_exit_2(store, tmp_path, monkeypatch):
    full = tmp_path / "full"
    full.mkdir()
    (full / "kept.txt").write_text("mine")
    cases = {"no trial nothing": ["--hf", "nothing", str(tmp_path / "a")],
             "could be any of": ["--hf", "llama_", str(tmp_path / "b")],
             "not an empty folder": ["--hf", "mamba-trial", str(full)],
             "no trained model": ["--hf", "untrained", str(tmp_path / "c")],
             "needs one of --parquet": []}
    for expected, args in cases.items():
        result = export(store, *args)
        assert result.exit_code == 2, (args, result.output)
        assert expected in result.output and len(result.output.strip().splitlines()) == 1, result.output
    assert (full / "kept.txt").read_text() == "mine" and len(list(full.iterdir())) == 1

    # without transformers a transformers checkpoint cannot be made: the extra is named;
    # a model that is not one is still written
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "transformers" else real(n, *a))
    result = export(store, "--hf", "mamba-trial", str(tmp_path / "d"))
    assert result.exit_code == 2 and "archsearch[hf]" in result.output and len(result.output.splitlines()) == 1
    assert not (tmp_path / "d").exists()
    assert export(store, "--hf", "tapered-trial", str(tmp_path / "e")).exit_code == 0


def test_an_empty_folder_is_written_into_and_parquet_still_exports(store, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert export(store, "--hf", "llama_tied-trial", str(empty)).exit_code == 0
    assert (empty / "config.json").exists() and (empty / "README.md").exists()
    result = export(store, "--parquet", str(tmp_path / "pq"))
    assert result.exit_code == 0 and (tmp_path / "pq" / "trials.parquet").exists(), result.output


def test_a_mapping_that_changes_the_logits_writes_nothing(store, tmp_path, monkeypatch):
    """The export's own check: with Llama's gate and up halves swapped in the mapping, the
    command refuses in one line (exit 1) and leaves no folder. Fails if the check is skipped."""
    from archsearch.export import hf

    right = hf.LAYOUTS["attention"]

    def swapped(spec, state):
        out = right.weights(spec, state)
        for i in range(spec.num_layers):
            gate, up = f"model.layers.{i}.mlp.gate_proj.weight", f"model.layers.{i}.mlp.up_proj.weight"
            out[gate], out[up] = out[up], out[gate]
        return out

    monkeypatch.setitem(hf.LAYOUTS, "attention", hf.Layout(right.hf_class, right.config, swapped))
    result = export(store, "--hf", "llama_tied-trial", str(tmp_path / "wrong"))
    assert result.exit_code == 1 and "nothing written" in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "wrong").exists() and list(tmp_path.iterdir()) == []
