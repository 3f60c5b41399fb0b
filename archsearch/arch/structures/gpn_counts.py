"""The counting formulas of ``gpn`` (parameters, FLOPs, state), importable without torch.

``gpn.py`` holds the module and re-exports these; the registry reads them from here,
so planning counts a model without importing torch."""

from __future__ import annotations

from dataclasses import dataclass

from archsearch.arch.spec import ArchSpec
from archsearch.arch.structures.stack_counts import reject_unknown_options


MIXER = "gpn"


@dataclass(frozen=True, kw_only=True)
class GPNOptions:
    """The options of "gpn" and "gpn_m", checked.

    ``layers``: the number of recurrent layers, 1 or 2 in the paper; it must
    equal ``len(spec.layers)`` (the spec holds one LayerSpec per layer, so the
    option may be left out). ``d_emb``: the embedding width E (default
    d_model), the paper's 768 beside its D = 2496. GPN+M only: ``mem_heads`` (default 4),
    ``mem_key_dim`` (default 3D / (4 mem_heads), at least 1) and
    ``mem_value_dim`` (default 2 mem_key_dim): the paper's headline
    H=15, K=128, W=256 at D=2496 (H K ~ 0.75 D, W = 2K), scaled down.
    """

    layers: int
    d_emb: int
    mem_heads: int | None = None
    mem_key_dim: int | None = None
    mem_value_dim: int | None = None

    @property
    def memory(self) -> tuple[int, int, int] | None:
        """(H, K, W), or None for GPN."""
        return None if self.mem_heads is None else (self.mem_heads, self.mem_key_dim, self.mem_value_dim)


def gpn_options(spec: ArchSpec) -> GPNOptions:
    """Parse and check ``spec.options`` and ``spec.layers``; a ValueError names what is wrong."""
    with_memory = spec.structure == "gpn_m"
    reject_unknown_options(spec, {"layers", "d_emb"} | ({"mem_heads", "mem_key_dim", "mem_value_dim"}
                                                        if with_memory else set()))
    layers = spec.options.get("layers", spec.num_layers)
    if layers != spec.num_layers or spec.num_layers < 1:
        raise ValueError(f"{spec.structure}: options['layers']={layers} must equal len(spec.layers)="
                         f"{spec.num_layers} (>= 1)")
    for layer in spec.layers:
        if layer.mixer != MIXER or layer.mlp != "swiglu" or layer.mlp_width < 1:
            raise ValueError(f"{spec.structure}: layers are LayerSpec(mixer='gpn', mlp='swiglu', mlp_width > 0); "
                             f"got {layer}")
    d_emb = spec.options.get("d_emb", spec.d_model)
    if not isinstance(d_emb, int) or isinstance(d_emb, bool) or d_emb < 1:
        raise ValueError(f"{spec.structure}: d_emb (the embedding width) must be an int >= 1, got {d_emb!r}")
    if not with_memory:
        return GPNOptions(layers=layers, d_emb=d_emb)
    heads = spec.options.get("mem_heads", 4)
    key_dim = spec.options.get("mem_key_dim", max(1, 3 * spec.d_model // (4 * max(1, heads))))
    value_dim = spec.options.get("mem_value_dim", 2 * key_dim)
    if not all(isinstance(n, int) and n >= 1 for n in (heads, key_dim, value_dim)):
        raise ValueError(f"gpn_m: mem_heads, mem_key_dim, mem_value_dim must be ints >= 1; got "
                         f"{(heads, key_dim, value_dim)}")
    return GPNOptions(layers=layers, d_emb=d_emb, mem_heads=heads, mem_key_dim=key_dim, mem_value_dim=value_dim)


def paper_params(*, vocab_size: int, d_state: int, d_emb: int, ffn_widths: tuple[int, ...],
                 memory: tuple[int, int, int] | None) -> int:
    """Every parameter of a GPN(+M) with a tied embedding of width ``d_emb``, as in
    papers.md section 4 (``memory`` = (H, K, W), None for GPN): what ``GPN``
    builds with ``d_emb`` set (tested in the zoo). The paper's headline 1L GPN+M is
    ``paper_params(vocab_size=32000, d_state=2496, d_emb=768, ffn_widths=(6656,),
    memory=(15, 128, 256))`` = 129.15M; ``GPN`` builds it with options
    ``d_emb=768, mem_heads=15, mem_key_dim=128, mem_value_dim=256``."""
    d, e = d_state, d_emb
    gate = d * d + 2 * d  # its RMSNorm, W and b
    total = vocab_size * e + (d + d * e) + (e + e * d + gate)  # embedding, decoder, fuse and its gate
    if memory is not None:
        H, K, W = memory
        total += d + (d * H * K + H * K) + d * (H * W + 2 * H) + 2 * H  # the shared write
    for width in ffn_widths:
        total += (d + 3 * d * width) + gate
        if memory is not None:
            total += d + (d * H * K + H * K) + d * H * W + H * W + H * W * d  # this layer's read
    return total


def params(spec: ArchSpec) -> int:
    """Non-embedding: ``paper_params`` less the tied V x E embedding (an untied
    head is counted by the caller, as for every structure)."""
    opts = gpn_options(spec)
    total = paper_params(vocab_size=spec.vocab_size, d_state=spec.d_model, d_emb=opts.d_emb,
                         ffn_widths=spec.mlp_widths, memory=opts.memory)
    return total - spec.vocab_size * opts.d_emb


def embedding_width(spec: ArchSpec) -> int:
    """E: the width of the embedding and LM head (``d_emb``, default d_model)."""
    return gpn_options(spec).d_emb


def mixing(spec: ArchSpec, seq_len: int) -> float:
    """Memory work per token, which torch sees as einsums, not Linear: the write
    (recall M^T k 2HKW, decay HKW, outer product HKW, add HKW) and one read
    (M q, 2HKW) per layer; 0 for GPN. Gates, norms and activations are not counted."""
    memory = gpn_options(spec).memory
    if memory is None:
        return 0.0
    H, K, W = memory
    return float(5 * H * K * W + spec.num_layers * 2 * H * K * W)


def flops(spec: ArchSpec, seq_len: int) -> float:
    """Forward FLOPs per token, LM head excluded, independent of ``seq_len``: 2 per
    Linear weight (each Linear runs once per token; biases and the embedding lookup
    are free) plus ``mixing``."""
    opts = gpn_options(spec)
    d, e, memory = spec.d_model, opts.d_emb, opts.memory
    matrices = 2 * e * d + d * d  # fuse, decoder, fuse gate
    for width in spec.mlp_widths:
        matrices += 3 * d * width + d * d  # FFN, keep gate
    if memory is not None:
        H, K, W = memory
        matrices += d * H * K + d * (H * W + 2 * H)  # the write
        matrices += spec.num_layers * (d * H * K + 2 * d * H * W)  # the reads: query, gate, out
    return 2.0 * matrices + mixing(spec, seq_len)


def state(spec: ArchSpec, seq_len: int) -> int:
    """Values a sequence keeps, independent of ``seq_len``: the predicted state and
    the previous grounded one (2D), plus the memory (H K W) for GPN+M."""
    memory = gpn_options(spec).memory
    return 2 * spec.d_model + (0 if memory is None else memory[0] * memory[1] * memory[2])
