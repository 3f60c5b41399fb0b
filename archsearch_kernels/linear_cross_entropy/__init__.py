"""Linear layer + cross-entropy for large vocabularies: the PyTorch reference and the chunked
Triton form that never holds the full [tokens, V] logits."""

from .naive import linear_cross_entropy_naive


def linear_cross_entropy_triton(*args, **kwargs):
    """The Triton kernel; imported on first use so importing this package never loads triton."""
    from .kernel import linear_cross_entropy_triton as kernel

    return kernel(*args, **kwargs)


__all__ = ["linear_cross_entropy_naive", "linear_cross_entropy_triton"]
