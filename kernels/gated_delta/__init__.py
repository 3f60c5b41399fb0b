"""Gated delta rule (Gated DeltaNet): the reference loop (the spec), the chunked WY form and
the recurrent Triton kernel."""

from .chunked import gated_delta_rule_chunked
from .naive import gated_delta_rule_naive


def gated_delta_rule_triton(*args, **kwargs):
    """The Triton kernel; imported on first use so importing this package never loads triton."""
    from .kernel import gated_delta_rule_triton as kernel

    return kernel(*args, **kwargs)


__all__ = ["gated_delta_rule_chunked", "gated_delta_rule_naive", "gated_delta_rule_triton"]
