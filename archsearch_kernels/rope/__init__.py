"""Rotary embeddings on the fused q, k, v projection: the PyTorch reference (the spec) and the
C++ CPU kernel (cpu.py, compiled on first use). On CUDA the reference runs: its few elementwise
passes are cheap beside attention there."""

from .cpu import rope_heads_cpu
from .naive import apply_rope, rope_heads_naive, rope_tables

__all__ = ["apply_rope", "rope_heads_cpu", "rope_heads_naive", "rope_tables"]
