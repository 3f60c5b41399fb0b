"""Gated delta rule (Gated DeltaNet): the reference loop (the spec) and the chunked WY form."""

from .chunked import gated_delta_rule_chunked
from .naive import gated_delta_rule_naive

__all__ = ["gated_delta_rule_chunked", "gated_delta_rule_naive"]
