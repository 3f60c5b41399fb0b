"""Gated delta rule (Gated DeltaNet): the reference loop (the spec), the chunked WY form, the
recurrent Triton kernel and the chunked Triton kernels."""

from .chunked import gated_delta_rule_chunked
from .naive import gated_delta_rule_naive


def gated_delta_rule_triton(*args, **kwargs):
    """The Triton kernel; imported on first use so importing this package never loads triton."""
    from .kernel import gated_delta_rule_triton as kernel

    return kernel(*args, **kwargs)


def gated_delta_rule_chunked_triton(*args, **kwargs):
    """The chunked (WY form) Triton kernels; imported on first use, like the recurrent one."""
    from .chunked_kernel import gated_delta_rule_chunked_triton as kernel

    return kernel(*args, **kwargs)


__all__ = ["gated_delta_rule_chunked", "gated_delta_rule_chunked_triton", "gated_delta_rule_naive",
           "gated_delta_rule_triton"]
