"""softplus(x + bias), the step sizes of the recurrent mixers: the PyTorch reference and the C++
CPU kernel (cpu.py, compiled on first use). On CUDA the reference runs (one fused elementwise
op there already)."""

from .cpu import softplus_cpu
from .naive import softplus_naive

__all__ = ["softplus_cpu", "softplus_naive"]
