"""From a point of a space to an ArchSpec, given the widths the solver picks.

A family is a recipe for the per-layer tuple and the structure that wires it;
the blocks themselves live in the registry. Every family has MLPs whose total
width the solver sizes and the taper spreads over depth. Torch-free.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from archsearch.arch.spec import ArchSpec, LayerSpec
from archsearch.arch.structures.memory_counts import default_placement
from archsearch.arch.taper import taper_widths
from archsearch.space.schema import MAMBA2_AXES, ModelOptions

SpecMaker = Callable[[int, int], ArchSpec]  # (d_model, total MLP width) -> spec

LETTERS = {"A": "attention", "M": "mamba", "S": "mamba2", "G": "gated_deltanet"}
RATIO_LETTER = {"mamba": "M", "mamba2": "S", "gdn": "G"}  # hybrid.mixer -> the letter a ratio builds
SINGLE_MIXER = {"transformer": "attention", "gated_attention": "gated_attention", "mamba": "mamba",
                "mamba2": "mamba2",
                "gdn": "gated_deltanet", "titans": "titans", "hope": "attention", "memory": "attention",
                "hrm": "attention", "universal": "attention"}
# Derived values (space.derived) that shape a point's Gated DeltaNet layers, as the layer's options:
# heads, key and value width per head (each 0 or absent: the layer's default, d_model / head_dim
# heads of head_dim keys and values).
GDN_SHAPE = {"gdn_heads": "num_heads", "gdn_key_dim": "head_k_dim", "gdn_value_dim": "head_v_dim"}
STRUCTURE = {"looped": "looped", "memory": "memory", "hrm": "hrm", "universal": "universal"}


def ratio_pattern(ratio: str, num_layers: int, recurrent: str = "M") -> str:
    """'3:1' over 8 layers -> 'MMMAMMMA': attention layers spread evenly, last one at the top."""
    rec, att = (int(x) for x in ratio.split(":"))
    if rec + att == 0:
        raise ValueError(f"hybrid ratio {ratio!r} has no layers")
    n_att = round(num_layers * att / (rec + att))
    places = {round((j + 1) * num_layers / n_att) - 1 for j in range(n_att)} if n_att else set()
    return "".join("A" if i in places else recurrent for i in range(num_layers))


def tiled(pattern: str, num_layers: int) -> str:
    """A pattern repeated (and cut) to ``num_layers`` letters, nanochat-style."""
    return (pattern * (num_layers // len(pattern) + 1))[:num_layers]


def mixers_of(point: Mapping[str, Any], num_layers: int) -> list[str]:
    """The mixer of every layer of this point."""
    family = point["family"]
    if family == "hybrid":
        pattern = point.get("hybrid.pattern")
        if not pattern:  # no pattern written: build one from the ratio
            letter = RATIO_LETTER[point.get("hybrid.mixer", "mamba")]
            pattern = ratio_pattern(point.get("hybrid.ratio", "3:1"), num_layers, letter)
        return [LETTERS[c] for c in tiled(pattern, num_layers)]
    if family == "looped":
        return [LETTERS[c] for c in tiled(point.get("hybrid.pattern") or "A", num_layers)]
    if family == "gpn":
        return ["gpn"] * num_layers
    return [SINGLE_MIXER[family]] * num_layers


def layer_count(point: Mapping[str, Any]) -> int:
    return point["gpn.layers"] if point["family"] == "gpn" else point["num_layers"]


def spec_maker(point: Mapping[str, Any], options: ModelOptions, *, vocab_size: int) -> SpecMaker:
    """A function (d_model, total MLP width) -> ArchSpec for this point."""
    family = point["family"]
    num_layers = layer_count(point)
    mixers = mixers_of(point, num_layers)
    mlp = "cms" if family == "hope" else point.get("mlp", "swiglu")
    structure, structure_options = _structure(point)
    mixer_options = _mixer_options(point, mixers)
    made: dict[tuple[str, int], LayerSpec] = {}  # layers are frozen: share equal ones

    def layer(mixer: str, width: int) -> LayerSpec:
        width = 0 if mlp == "none" else width  # mixer-only layers: the solver's width goes unused
        if (mixer, width) not in made:
            made[mixer, width] = LayerSpec(mixer=mixer, mlp=mlp, mlp_width=width,
                                           options=mixer_options.setdefault(mixer, {}))
        return made[mixer, width]

    def make(d_model: int, total_width: int) -> ArchSpec:
        widths = taper_widths(shape=point.get("taper.shape", "uniform"), ratio=point.get("taper.ratio", 1.0),
                              num_layers=num_layers, total=total_width, multiple_of=options.multiple_of)
        layers = tuple(layer(m, w) for m, w in zip(mixers, widths))
        return ArchSpec(family=family, vocab_size=vocab_size, d_model=d_model,
                        num_heads=max(1, d_model // options.head_dim), layers=layers, structure=structure,
                        options=dict(structure_options),
                        tie_embeddings=point.get("tie_embeddings", options.tie_embeddings),
                        rope_theta=options.rope_theta)

    return make


def _mixer_options(point: Mapping[str, Any], mixers: list[str]) -> dict[str, dict]:
    """The options of each mixer this point's layers name, from its axes (one dict per mixer,
    shared by its layers)."""
    options: dict[str, dict] = {}
    if point["family"] == "gated_attention":
        options["gated_attention"] = {"gate": point["attention.gate"]}
    if "mamba2" in mixers:
        options["mamba2"] = {name.partition(".")[2]: point[name] for name in MAMBA2_AXES}
    if "gated_deltanet" in mixers:  # derived values only, so studies without them keep their trial ids
        options["gated_deltanet"] = {option: point[name] for name, option in GDN_SHAPE.items() if point.get(name)}
    return options


def _structure(point: Mapping[str, Any]) -> tuple[str, dict]:
    family = point["family"]
    if family == "looped":
        options = {"loops": point["loops"], "exit_gate": point["exit_gate"], "inject": True}
        if point["exit_gate"]:  # the gate's options; written only where they differ from the structure's defaults
            defaults = {"exit_threshold": None, "cache_hole": 0.0, "exit_entropy": 0.05}
            options.update({k: point[k] for k, default in defaults.items() if point.get(k, default) != default})
        return "looped", options
    if family == "universal":
        return "universal", {"steps": point["loops"]}
    if family == "memory":
        placement = point["memory.placement"]
        if placement is None:  # written out (it is part of the trial id), but the structure's default
            placement = default_placement(point["num_layers"])
        options = {"placement": placement, "slots": point["memory.slots"], "segment": point["memory.segment"]}
        if point["memory.width"]:  # 0 keeps the structure's default width
            options["memory_dim"] = point["memory.width"]
        if point.get("memory.aux", "none") != "none":
            options.update(aux=point["memory.aux"], aux_weight=point["memory.aux_weight"])
        if point.get("memory.carry"):
            options["carry"] = True
        return "memory", options
    if family == "gpn":
        # options left at 0 are left out: the structure's defaults (and unchanged trial ids)
        widths = ["d_emb"] + (["mem_heads", "mem_key_dim", "mem_value_dim"] if point["gpn.memory"] else [])
        return ("gpn_m" if point["gpn.memory"] else "gpn"), {
            name: point[f"gpn.{name}"] for name in widths if point.get(f"gpn.{name}")}
    if family == "hrm":
        options = {"N": point["hrm.N"], "T": point["hrm.T"]}
        if point.get("hrm.grad", "bptt") != "bptt":
            options["grad"] = point["hrm.grad"]
        if point.get("hrm.segments", 1) != 1:
            options["segments"] = point["hrm.segments"]
        return "hrm", options
    return "stack", {}
