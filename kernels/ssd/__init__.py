"""Mamba-2 state-space duality (SSD): the reference loop (the spec) and the chunked matmul form."""

from .chunked import ssd_chunked
from .naive import ssd_naive

__all__ = ["ssd_chunked", "ssd_naive"]
