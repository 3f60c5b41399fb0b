"""Mamba-1 selective scan: the reference loop (the spec) and the chunked form."""

from .chunked import selective_scan_chunked
from .naive import selective_scan_naive

__all__ = ["selective_scan_chunked", "selective_scan_naive"]
