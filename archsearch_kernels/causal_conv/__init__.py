"""Causal depthwise conv1d (+ SiLU): the PyTorch reference (the spec) and the C++ CPU kernel
(cpu.py, compiled on first use). On CUDA the reference runs."""

from .cpu import causal_conv1d_cpu
from .naive import causal_conv1d_naive

__all__ = ["causal_conv1d_cpu", "causal_conv1d_naive"]
