"""An estimate of a trial's peak training memory, from its spec and recipe, without building it.

Training in fp32 with AdamW keeps, at its peak (the backward pass of a micro-batch):

- **weights**: every parameter and its gradient, 4 bytes each (embeddings included);
- **optimizer**: AdamW's two moments, 8 bytes per parameter;
- **activations**: what each layer keeps for its backward pass, per token of the micro-batch
  (``batch_size / grad_accum`` rows of ``seq_len`` tokens): ``MIXER_FLOATS[mixer] x d_model``
  floats for the mixer (norms and residual included) and ``4 x mlp_width`` for a SwiGLU MLP
  (gate, up, their product and its activation; 2 for another MLP), times the times a structure
  applies its layers (loops, HRM's N x T, a Universal Transformer's steps);
- **logits**: the ``[B, T, V]`` logits, the log-softmax the loss keeps and their gradient,
  3 floats per token and vocabulary entry.

Evaluation runs whole batches (``batch_size`` rows) without gradients: the logits and
log-softmax of one batch beside the weights, optimizer state and gradients still held. The
peak is the larger of the two. The mixers' coefficients were measured on CPU (peak resident
memory of a training step over the process's resident memory before it, at batch x seq_len
from 1k to 32k tokens); the Python and torch runtime itself (a few hundred MB per worker) is
not counted. tests/test_hostile_plan.py holds the estimate within a factor of 2 of measured
peaks. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass

from archsearch.arch.spec import ArchSpec
from archsearch.budget.count import count_params

FLOAT_BYTES = 4
# floats per token and unit of d_model each mixer keeps for its backward pass (measured, see above)
MIXER_FLOATS = {"attention": 12, "gated_attention": 14, "mamba": 28, "gated_deltanet": 42, "mamba2": 84}
OTHER_MIXER_FLOATS = 48  # a mixer not measured yet: the mean of the recurrent ones
LOGIT_FLOATS = 3


@dataclass(frozen=True, kw_only=True)
class MemoryEstimate:
    """Bytes at a trial's training peak, by what holds them (see the module's docstring)."""

    weights: int  # parameters and gradients
    optimizer: int  # AdamW's moments
    activations: int  # kept for backward, one micro-batch
    logits: int  # logits, log-softmax and their gradient (training), or evaluation's, if larger

    @property
    def total(self) -> int:
        return self.weights + self.optimizer + self.activations + self.logits

    def to_dict(self) -> dict[str, int]:
        return dict(weights=self.weights, optimizer=self.optimizer, activations=self.activations,
                    logits=self.logits, total=self.total)


def applications(spec: ArchSpec) -> int:
    """How many times the structure runs its layers in one forward pass."""
    options = spec.options
    if spec.structure == "looped":
        return int(options.get("loops", 1))
    if spec.structure == "hrm":
        return int(options.get("N", 1)) * int(options.get("T", 1))
    if spec.structure == "universal":
        return int(options.get("steps", 1))
    return 1


def estimate_memory(spec: ArchSpec, *, batch_size: int, grad_accum: int, seq_len: int) -> MemoryEstimate:
    """The peak training memory of ``spec`` at ``batch_size`` rows (split in ``grad_accum``
    micro-batches) of ``seq_len`` tokens, in bytes, by part."""
    params = count_params(spec, embeddings=True)
    micro_tokens = batch_size // grad_accum * seq_len
    per_token = sum(MIXER_FLOATS.get(layer.mixer, OTHER_MIXER_FLOATS) * spec.d_model
                    + (4 if layer.mlp == "swiglu" else 2) * layer.mlp_width * (layer.mlp != "none")
                    for layer in spec.layers) * applications(spec)
    train_logits = LOGIT_FLOATS * micro_tokens * spec.vocab_size
    eval_logits = 2 * batch_size * seq_len * spec.vocab_size
    activations = per_token * micro_tokens
    # evaluation holds no activations for backward: its logits count only where they exceed training's peak
    logits = max(train_logits, eval_logits - activations)
    return MemoryEstimate(weights=2 * params * FLOAT_BYTES, optimizer=2 * params * FLOAT_BYTES,
                          activations=activations * FLOAT_BYTES, logits=logits * FLOAT_BYTES)


def readable_bytes(count: float) -> str:
    """``1.2 GB``, ``340 MB``, ``12 kB`` (powers of 1000)."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= size:
            return f"{count / size:.3g} {unit}"
    return f"{int(count)} B"
