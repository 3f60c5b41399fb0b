"""Checkpoints of one trial: resume after preemption, reload a trained model.

A trial's folder holds, while it trains, ``step-<N>/`` (``model.safetensors``,
``trainer.pt`` with the optimizer, RNG states, step and curve, and
``spec.json``), only the newest kept; and once it finishes, the final
``model.safetensors`` and ``spec.json`` at the top. Every write is atomic
(a temporary name, then a rename), so a trial killed mid-write leaves the
previous checkpoint whole.

On a cluster the folder can live on object storage: ``pull`` fetches a
trial's folder from a URI any pyarrow file system opens (s3://, gs://,
file://) and ``push`` mirrors the local folder back after each write.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from archsearch.arch.model import build_model
from archsearch.arch.spec import ArchSpec

MODEL_FILE = "model.safetensors"
SPEC_FILE = "spec.json"
TRAINER_FILE = "trainer.pt"
STEP_PREFIX = "step-"


@dataclass
class TrainerState:
    """What the loop carries between steps besides weights and optimizer."""

    step: int = 0
    tokens: int = 0
    elapsed_s: float = 0.0
    recent: list[float] = field(default_factory=list)
    curve: list[dict] = field(default_factory=list)


def latest(folder: str | Path) -> Path | None:
    """The newest complete ``step-<N>`` folder under ``folder``, or None."""
    folder = Path(folder)
    steps = sorted(folder.glob(f"{STEP_PREFIX}*")) if folder.is_dir() else []
    complete = [p for p in steps if (p / TRAINER_FILE).exists() and p.name[len(STEP_PREFIX):].isdigit()]
    return complete[-1] if complete else None


def save(folder: str | Path, *, model: nn.Module, spec: ArchSpec, optimizer: torch.optim.Optimizer,
         state: TrainerState, generator: torch.Generator, fingerprint: str) -> Path:
    """Write ``step-<state.step>/`` atomically, then drop older step folders. Returns the new folder."""
    from safetensors.torch import save_model

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"{STEP_PREFIX}{state.step:09d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=folder))
    try:
        save_model(model, str(tmp / MODEL_FILE))
        (tmp / SPEC_FILE).write_text(json.dumps(spec.to_dict(), indent=1))
        rng = {"stream": generator.get_state(), "torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        torch.save({"optimizer": optimizer.state_dict(), "rng": rng, "fingerprint": fingerprint,
                    "state": vars(state)}, tmp / TRAINER_FILE)
        if final.exists():  # the same step saved before (a rerun of a finished trial)
            shutil.rmtree(final)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    # Older checkpoints, and temporaries a killed write left behind (one trial writes a folder).
    for older in [*folder.glob(f"{STEP_PREFIX}*"), *folder.glob(f".{STEP_PREFIX}*")]:
        if older != final:
            shutil.rmtree(older, ignore_errors=True)
    return final


def restore(checkpoint: Path, *, model: nn.Module, optimizer: torch.optim.Optimizer,
            generator: torch.Generator, fingerprint: str) -> TrainerState:
    """Load a ``step-<N>`` folder into ``model``, ``optimizer`` and the RNGs; the loop's state.

    Raises ValueError when the checkpoint was made by another trial (spec, recipe, data or seed).
    """
    from safetensors.torch import load_model as load_weights

    saved = torch.load(checkpoint / TRAINER_FILE, map_location="cpu", weights_only=True)
    if saved["fingerprint"] != fingerprint:
        raise ValueError(f"the checkpoint in {checkpoint.parent} belongs to another trial; "
                         "give each trial its own checkpoint_dir")
    load_weights(model, str(checkpoint / MODEL_FILE), device=str(next(model.parameters()).device))
    optimizer.load_state_dict(saved["optimizer"])
    generator.set_state(saved["rng"]["stream"])
    torch.set_rng_state(saved["rng"]["torch"])
    if "cuda" in saved["rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(saved["rng"]["cuda"])
    return TrainerState(**saved["state"])


def save_final(folder: str | Path, *, model: nn.Module, spec: ArchSpec) -> None:
    """The trained model as ``model.safetensors`` and its resolved spec as ``spec.json``."""
    from safetensors.torch import save_model

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    # Spec first: a reader that finds the weights always finds the spec beside them.
    _atomic(folder / SPEC_FILE, lambda path: path.write_text(json.dumps(spec.to_dict(), indent=1)))
    _atomic(folder / MODEL_FILE, lambda path: save_model(model, str(path)))


def load_model(checkpoint_dir: str | Path, *, device: str | torch.device = "cpu") -> nn.Module:
    """The trained model of a trial's folder, in eval mode: tokens [B, T] int64 -> logits [B, T, V].

    Reads the final ``model.safetensors`` + ``spec.json``, or, for a trial
    still training, its newest ``step-<N>`` checkpoint.
    """
    from safetensors.torch import load_model as load_weights

    folder = Path(checkpoint_dir)
    if not (folder / MODEL_FILE).exists():
        newest = latest(folder)
        if newest is None:
            raise FileNotFoundError(f"no {MODEL_FILE} and no {STEP_PREFIX}<N> checkpoint in {folder}")
        folder = newest
    spec = ArchSpec.from_dict(json.loads((folder / SPEC_FILE).read_text()))
    model = build_model(spec).to(device)
    load_weights(model, str(folder / MODEL_FILE), device=str(device))
    return model.eval()


def is_uri(location: str | Path) -> bool:
    """Whether a checkpoint location names a pyarrow file system (s3://, gs://, file://...)."""
    return "://" in str(location)


def pull(uri: str, folder: str | Path) -> None:
    """Copy a trial's checkpoints at ``uri`` (any file system pyarrow opens)
    into the local ``folder``; nothing when there are none yet."""
    from pyarrow import fs

    remote, root = fs.FileSystem.from_uri(uri)
    if remote.get_file_info(root).type == fs.FileType.NotFound:
        return
    fs.copy_files(root, str(folder), source_filesystem=remote, destination_filesystem=fs.LocalFileSystem())


def push(folder: str | Path, uri: str) -> None:
    """Mirror the local checkpoint ``folder`` to ``uri``: new step folders
    and final files up, then step folders gone locally removed there.

    Within a step folder ``trainer.pt`` goes last, so a push cut short never
    leaves a step that ``latest`` takes for complete (object stores write
    each file whole); older steps go only once the newer one is up.
    """
    from pyarrow import fs

    folder = Path(folder)
    remote, root = fs.FileSystem.from_uri(uri)
    remote.create_dir(root, recursive=True)
    there = {info.base_name: info for info in remote.get_file_info(fs.FileSelector(root))}
    here = sorted(p for p in folder.iterdir() if not p.name.startswith("."))
    local = fs.LocalFileSystem()
    for path in here:
        if path.is_dir():
            if path.name in there:  # a step folder, written once
                continue
            files = sorted(path.iterdir(), key=lambda f: f.name == TRAINER_FILE)
            remote.create_dir(f"{root}/{path.name}", recursive=True)
            for file in files:
                fs.copy_files(str(file), f"{root}/{path.name}/{file.name}", source_filesystem=local,
                              destination_filesystem=remote)
        else:
            fs.copy_files(str(path), f"{root}/{path.name}", source_filesystem=local, destination_filesystem=remote)
    names = {p.name for p in here}
    for name, info in there.items():
        if name not in names and info.type == fs.FileType.Directory:
            remote.delete_dir(f"{root}/{name}")


def _atomic(path: Path, write) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


__all__ = ["TrainerState", "is_uri", "latest", "load_model", "pull", "push", "restore", "save", "save_final"]
