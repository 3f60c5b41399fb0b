"""Mamba-2 state-space duality (SSD): the reference loop (the spec), the chunked matmul form
and the recurrent Triton kernel."""

from .chunked import ssd_chunked
from .naive import ssd_naive


def ssd_triton(*args, **kwargs):
    """The Triton kernel; imported on first use so importing this package never loads triton."""
    from .kernel import ssd_triton as kernel

    return kernel(*args, **kwargs)


__all__ = ["ssd_chunked", "ssd_naive", "ssd_triton"]
