"""Sequence-mixing ops, each in its own folder: a pure-PyTorch reference (naive.py) beside a faster form."""
