"""SwiGLU's gating product silu(gate) * up: the PyTorch reference and the fused Triton kernel."""

from .naive import swiglu_naive


def swiglu_triton(*args, **kwargs):
    """The Triton kernel; imported on first use so importing this package never loads triton."""
    from .kernel import swiglu_triton as kernel

    return kernel(*args, **kwargs)


__all__ = ["swiglu_naive", "swiglu_triton"]
