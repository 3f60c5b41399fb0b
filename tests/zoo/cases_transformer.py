"""Zoo cases for the plain Transformer++ stack (contract suite: test_contract.py)."""

from archsearch.arch.spec import ArchSpec, LayerSpec


def transformer(*, d_model=32, head_dim=8, widths=(64, 48), vocab=64, tie=True) -> ArchSpec:
    return ArchSpec(family="transformer", vocab_size=vocab, d_model=d_model, num_heads=d_model // head_dim,
                    layers=tuple(LayerSpec(mlp_width=w) for w in widths), tie_embeddings=tie)


CASES = {
    "transformer-d32": transformer(),
    "transformer-d48-untied-tapered": transformer(d_model=48, head_dim=16, widths=(160, 96, 32), tie=False),
}

LEARN = {
    "transformer": (transformer(d_model=64, head_dim=16, widths=(128, 128), vocab=64), {}),
}
