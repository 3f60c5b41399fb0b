"""SwiGLU's gating product silu(gate) * up: the PyTorch reference, the fused Triton
kernel (CUDA) and the C++ CPU kernel (cpu.py, compiled on first use)."""

from .cpu import swiglu_cpu
from .naive import swiglu_naive


def swiglu_triton(*args, **kwargs):
    """The Triton kernel; imported on first use so importing this package never loads triton."""
    from .kernel import swiglu_triton as kernel

    return kernel(*args, **kwargs)


__all__ = ["swiglu_cpu", "swiglu_naive", "swiglu_triton"]
