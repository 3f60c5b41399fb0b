"""Mamba-1 selective scan: the reference loop (the spec), the chunked PyTorch form, the Triton
kernel (CUDA) and the C++ CPU kernel (cpu.py, compiled on first use)."""

from .chunked import selective_scan_chunked
from .cpu import selective_scan_cpu
from .naive import selective_scan_naive


def selective_scan_triton(*args, **kwargs):
    """The Triton kernel; imported on first use so importing this package never loads triton."""
    from .kernel import selective_scan_triton as kernel

    return kernel(*args, **kwargs)


__all__ = ["selective_scan_chunked", "selective_scan_cpu", "selective_scan_naive", "selective_scan_triton"]
