"""The counting formulas of ``titans`` (parameters, FLOPs, state), importable without torch.

``titans.py`` holds the module and re-exports these; the registry reads them from here,
so planning counts a model without importing torch."""

from __future__ import annotations

from dataclasses import dataclass

from archsearch.arch.spec import ArchSpec, LayerSpec


@dataclass(frozen=True)
class MemorySizes:
    """The resolved sizes of one Titans layer."""

    d_model: int
    heads: int  # H
    key: int  # K
    depth: int
    hidden: int  # E (depth 2 only)
    chunk: int
    conv: int
    max_lr: float
    max_grad_norm: float

    @property
    def shapes(self) -> list[tuple[int, int]]:
        """(out, in) of each memory layer, per head."""
        if self.depth == 1:
            return [(self.key, self.key)]
        return [(self.hidden, self.key), (self.key, self.hidden)]

    @property
    def memory_weights(self) -> int:
        """Weights of one head's memory: sum over layers of O I."""
        return sum(o * i for o, i in self.shapes)


def sizes(spec: ArchSpec, layer: LayerSpec) -> MemorySizes:
    """Sizes from ``layer.options`` and their defaults; raises on values out of range."""
    options = layer.options
    s = MemorySizes(d_model=spec.d_model, heads=spec.num_heads, key=spec.head_dim,
                    depth=options.get("memory_depth", 2), hidden=options.get("memory_width", 2 * spec.head_dim),
                    chunk=options.get("chunk", 16), conv=options.get("d_conv", 4),
                    max_lr=options.get("max_lr", 0.5), max_grad_norm=options.get("max_grad_norm", 1.0))
    if s.depth not in (1, 2):
        raise ValueError(f"titans: options['memory_depth'] must be 1 or 2, got {s.depth!r}")
    if s.chunk < 1 or s.hidden < 1 or s.conv < 0 or s.max_lr <= 0 or s.max_grad_norm <= 0:
        raise ValueError(f"titans: need chunk, memory_width >= 1, d_conv >= 0, max_lr, max_grad_norm > 0; "
                         f"got {options}")
    return s


def params(spec: ArchSpec, layer: LayerSpec) -> int:
    """q, k, v projections 3D^2, their convs 3D k, gate projection 3DH and biases 3H, the
    memory's initial weights H (K^2 | 2KE), the per-head norm D, output gate D^2 and output
    projection D^2."""
    s = sizes(spec, layer)
    d, h = s.d_model, s.heads
    return 3 * d * d + 3 * d * s.conv + 3 * d * h + 3 * h + h * s.memory_weights + d + 2 * d * d


def _chunk_matmuls(s: MemorySizes, n: int) -> float:
    """Matmul FLOPs of one head over one chunk of ``n`` tokens (see ``mixing``)."""
    total = 2.0 * n**3 + 2.0 * n**2
    for depth, (o, i) in enumerate(s.shapes):
        total += 10.0 * n * o * i + 2.0 * n * n * (o + i)
        if depth > 0:
            total += 2.0 * n * o * i
    return total


def mixing(spec: ArchSpec, layer: LayerSpec, seq_len: int) -> float:
    """The memory's matmuls per token and head, as the forward does them.

    Chunks of N (``memory_chunked``), per memory layer of O x I weights: forward on the
    keys 2NOI, the read through the chunk-start weights and momentum 4NOI, the read's
    kernel and mix over the chunk 2N^2 (I + O), the new weights and momentum 4NOI; for
    every layer but the first the backward step of the inner gradient 2NOI; per chunk
    the decay coefficients 2N^3 + 2N^2. A linear memory: 10NK^2 + 4N^2K + 2N^3 + 2N^2
    per chunk; a deep one: 22NKE + 4N^2(K + E) + 2N^3 + 2N^2. Summed over the chunks of
    ``seq_len`` (the last may be short), divided by ``seq_len``.

    Chunk 1 (``memory_online``), per token: forward 2OI, outer-product step 2OI and read
    2OI per layer, plus 2OI of backward for every layer but the first: 6K^2 for a linear
    memory, 14KE for a deep one.

    Activations, gates, clipping norms and the elementwise decay are not counted.
    """
    s = sizes(spec, layer)
    if s.chunk == 1:
        per_token = sum(6.0 * o * i + (2.0 * o * i if depth else 0.0) for depth, (o, i) in enumerate(s.shapes))
        return s.heads * per_token
    full, rest = divmod(seq_len, s.chunk)
    total = full * _chunk_matmuls(s, s.chunk) + (_chunk_matmuls(s, rest) if rest else 0.0)
    return s.heads * total / seq_len


def flops(spec: ArchSpec, layer: LayerSpec, seq_len: int) -> float:
    """Forward FLOPs per token: 2 per projection weight (3D^2 + 3DH + 2D^2), 2k 3D for the
    convs, plus ``mixing`` (the memory's initial weights are used inside ``mixing``)."""
    s = sizes(spec, layer)
    d, h = s.d_model, s.heads
    return 2.0 * (5 * d * d + 3 * d * h) + 2.0 * 3 * d * s.conv + mixing(spec, layer, seq_len)


def state(spec: ArchSpec, layer: LayerSpec, seq_len: int) -> int:
    """Values kept per sequence: per head the memory now, its momentum and, for chunks
    over 1, the chunk-start memory the open chunk's gradients are taken at
    ((2 | 3) H sum O I), and the conv's last k - 1 inputs (3D (k - 1)). Independent of seq_len."""
    s = sizes(spec, layer)
    copies = 2 if s.chunk == 1 else 3
    return copies * s.heads * s.memory_weights + 3 * s.d_model * max(0, s.conv - 1)
