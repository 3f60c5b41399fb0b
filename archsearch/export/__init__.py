"""Take a trained model out of archsearch: a transformers checkpoint, or archsearch's own files.

``export_trial`` writes a trial's trained model to a folder, in one of two forms:

- a transformers checkpoint (``config.json`` + safetensors weights, via ``save_pretrained``)
  when a transformers class computes exactly the same function: a plain stack of Transformer++
  layers as ``LlamaForCausalLM``, of Mamba layers as ``MambaForCausalLM``, of Mamba-2 layers as
  ``Mamba2ForCausalLM`` (the rules and every weight's layout are in ``hf.py``). Before anything
  is written the transformers model is run beside archsearch's on a random batch, and the
  export stops if their logits differ beyond float precision: a transformers release that
  computes one of these classes differently fails loudly rather than writing a wrong model.
- otherwise ``model.safetensors`` (the state dict) + ``spec.json`` (the ArchSpec), the layout of a
  trial's own final checkpoint, which ``A.build_model(ArchSpec.from_dict(spec))`` rebuilds and
  ``archsearch.train.checkpoint.load_model(folder)`` loads; ``Exported.reason`` says why it is
  not a transformers checkpoint.

Both forms carry ``README.md`` (what the folder holds and how to load it). Its own package,
rather than a module of ``inspect``: it is no analysis of a model but a way out of the
platform, the one place that imports transformers (lazily, the ``hf`` extra), and it sits
beside ``inspect`` to the right of ``train`` and ``store``, reading what they wrote.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from archsearch.errors import ArchsearchError
from archsearch.export.hf import LAYOUTS, to_transformers, why_not_hf

SPEC_BESIDE_HF = "archsearch_spec.json"  # not spec.json: that name marks archsearch's own weights
INSTALL_HF = "pip install 'archsearch[hf]'"


class ExportError(ArchsearchError):
    """The transformers model does not reproduce archsearch's logits: nothing is written (exit 1)."""


@dataclass(frozen=True)
class Exported:
    """What ``export_trial`` wrote: ``kind`` "transformers" (``hf_class`` set) or "archsearch"
    (``reason`` says why not transformers), the folder and the files in it."""

    kind: str
    folder: Path
    hf_class: str | None = None
    reason: str | None = None
    max_diff: float | None = None  # the largest |logit difference| of the check (transformers only)
    status: str = "completed"  # the trial's; another (running, paused) exported its newest checkpoint
    files: list[Path] = field(default_factory=list)


def export_trial(trial_id: str, folder: str | Path, *, store: str | Path = "archsearch.duckdb") -> Exported:
    """Write trial ``trial_id``'s trained model (its full id) to ``folder``, which must not exist
    or be empty. ValueError for a folder that holds files, a trial not trained, or transformers
    missing where the model maps to a transformers class; ExportError when the check fails."""
    import archsearch as A
    from archsearch.arch.spec import ArchSpec
    from archsearch.inspect import load_trained

    folder = Path(folder)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise ValueError(f"{folder} exists and is not an empty folder; name a new folder to export into")
    with A.open_store(store, read_only=True) as db:
        row = db.sql("SELECT status, spec, data FROM trials WHERE trial_id = ?", [trial_id]).to_pylist()
    if not row:
        raise ValueError(f"no trial {trial_id} in {store}; `archsearch status --store {store}` lists them")
    spec = ArchSpec.from_dict(json.loads(row[0]["spec"]))
    reason = why_not_hf(spec)
    if reason is None:
        _require_transformers(trial_id, LAYOUTS[spec.layers[0].mixer].hf_class)
    try:
        model = load_trained(trial_id, store=store)
    except FileNotFoundError:
        raise ValueError(f"trial {trial_id} has no trained model to export (it is {row[0]['status']}); "
                         "`archsearch run` trains it") from None
    seq_len = json.loads(row[0]["data"] or "{}").get("seq_len", 2048)
    folder.parent.mkdir(parents=True, exist_ok=True)
    # staged beside the folder and moved in whole: an export cut short leaves no half checkpoint
    with tempfile.TemporaryDirectory(prefix=f".{folder.name}-", dir=folder.parent) as tmp:
        staged = Path(tmp) / "out"
        if reason is None:
            done = _write_transformers(model, staged, max_positions=seq_len)
        else:
            done = _write_archsearch(model, staged, reason)
        _write_readme(staged, trial_id, done)
        if folder.exists():
            folder.rmdir()  # empty, checked above
        shutil.move(str(staged), str(folder))
    files = sorted(folder.iterdir())
    return Exported(kind=done.kind, folder=folder, hf_class=done.hf_class, reason=done.reason,
                    max_diff=done.max_diff, status=row[0]["status"], files=files)


def _require_transformers(trial_id: str, hf_class: str) -> None:
    import importlib.util

    if importlib.util.find_spec("transformers") is None:
        raise ValueError(f"trial {trial_id} exports as transformers' {hf_class}, which needs transformers: "
                         f"{INSTALL_HF}")


@contextmanager
def _quiet_transformers():
    """transformers' progress bars and its notes on kernels it falls back from, off while exporting
    (the command's own line says what was written), then as they were."""
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def _write_transformers(model, folder: Path, *, max_positions: int) -> Exported:
    with _quiet_transformers():
        return _checked_and_saved(model, folder, max_positions=max_positions)


def _checked_and_saved(model, folder: Path, *, max_positions: int) -> Exported:
    import torch

    hf_model = to_transformers(model, max_positions=max_positions)
    generator = torch.Generator().manual_seed(0)
    tokens_BT = torch.randint(0, model.spec.vocab_size, (2, min(33, max_positions)), generator=generator)
    with torch.no_grad():
        ours_BTV, theirs_BTV = model(tokens_BT).float(), hf_model(tokens_BT).logits.float()
    max_diff = (ours_BTV - theirs_BTV).abs().max().item()
    # float32 rounding grows with depth and logit size; a wrong weight moves logits by O(their size)
    allowed = 1e-3 * max(1.0, ours_BTV.abs().max().item())
    if not max_diff <= allowed:
        raise ExportError(f"transformers' {type(hf_model).__name__} gives logits up to {max_diff:.3g} away from "
                          f"archsearch's on a random batch (allowed {allowed:.3g}); nothing written. Export with "
                          "another transformers release, or report this with `pip show transformers`")
    hf_model.save_pretrained(folder)
    (folder / SPEC_BESIDE_HF).write_text(json.dumps(model.spec.to_dict(), indent=1))
    return Exported(kind="transformers", folder=folder, hf_class=type(hf_model).__name__, max_diff=max_diff)


def _write_archsearch(model, folder: Path, reason: str) -> Exported:
    from archsearch.train.checkpoint import save_final

    save_final(folder, model=model, spec=model.spec)
    return Exported(kind="archsearch", folder=folder, reason=reason)


def _write_readme(folder: Path, trial_id: str, done: Exported) -> None:
    if done.kind == "transformers":
        how = [f"A transformers checkpoint ({done.hf_class}) of archsearch trial {trial_id}:",
               "", "    from transformers import AutoModelForCausalLM",
               "    model = AutoModelForCausalLM.from_pretrained(FOLDER)", "",
               f"{SPEC_BESIDE_HF} is the archsearch spec it was trained as. Tokens in, logits out: the",
               "tokenizer is the one of the trial's data, not included."]
    else:
        how = [f"archsearch trial {trial_id}: not a transformers checkpoint, because {done.reason}.",
               "", "    import json, archsearch as A", "    from archsearch.arch.spec import ArchSpec",
               "    from safetensors.torch import load_model",
               "    model = A.build_model(ArchSpec.from_dict(json.load(open('spec.json'))))",
               "    load_model(model, 'model.safetensors')"]
    (folder / "README.md").write_text("\n".join(how) + "\n")


__all__ = ["ExportError", "Exported", "export_trial", "to_transformers", "why_not_hf"]
