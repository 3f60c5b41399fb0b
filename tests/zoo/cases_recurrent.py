"""Zoo cases for GPN, GPN+M, HRM-LM and the Universal Transformer (contract suite: test_contract.py)."""

from archsearch.arch.spec import ArchSpec, LayerSpec


def gpn(*, widths=(56,), d_model=40, vocab=64, memory=False, tie=True, **options) -> ArchSpec:
    """One LayerSpec per recurrent layer; num_heads is unused by GPN (kept 1)."""
    return ArchSpec(family="gpn", vocab_size=vocab, d_model=d_model, num_heads=1,
                    layers=tuple(LayerSpec(mixer="gpn", mlp_width=w) for w in widths),
                    structure="gpn_m" if memory else "gpn", options=options, tie_embeddings=tie)


def hrm(*, widths=(48, 40, 56), d_model=40, head_dim=8, vocab=64, **options) -> ArchSpec:
    return ArchSpec(family="transformer", vocab_size=vocab, d_model=d_model, num_heads=d_model // head_dim,
                    layers=tuple(LayerSpec(mlp_width=w) for w in widths), structure="hrm", options=options)


def universal(*, widths=(48, 40), d_model=40, head_dim=8, vocab=64, **options) -> ArchSpec:
    return ArchSpec(family="transformer", vocab_size=vocab, d_model=d_model, num_heads=d_model // head_dim,
                    layers=tuple(LayerSpec(mlp_width=w) for w in widths), structure="universal", options=options)


CASES = {
    "gpn-1layer-d40": gpn(layers=1),
    "gpn-2layers-d40-untied": gpn(widths=(56, 72), layers=2, tie=False),
    "gpn_m-1layer-d40-2heads": gpn(memory=True, mem_heads=2),
    "gpn_m-2layers-d48-2heads-k12-w20": gpn(widths=(72, 40), d_model=48, memory=True, mem_heads=2, mem_key_dim=12,
                                            mem_value_dim=20),
    # embedding narrower / wider than the state, as the paper's E = 768 beside D = 2496
    "gpn-1layer-d40-emb24": gpn(d_emb=24),
    "gpn_m-2layers-d40-emb56-untied": gpn(widths=(56, 48), d_emb=56, tie=False, memory=True, mem_heads=2),
    "hrm-N2-T2-fast2-slow1": hrm(N=2, T=2, fast_layers=2, slow_layers=1),
    "hrm-N3-T1-fast1-slow2": hrm(N=3, T=1, fast_layers=1),
    "hrm-N2-T2-one-step-segments2": hrm(N=2, T=2, grad="one_step", segments=2),
    "universal-steps3": universal(steps=3),
    "universal-steps2-no-step-embedding": universal(widths=(72,), steps=2, step_embedding=False),
}

# GPN wants a lower learning rate than the zoo's 1e-2: at 1e-2 GPN+M stays at
# chance (the paper trains at 6e-4). Measured accuracies: docs/architectures.md.
LEARN = {
    "gpn": (gpn(widths=(128,), d_model=64), dict(steps=800, lr=3e-3)),
    "gpn_m": (gpn(widths=(128,), d_model=64, memory=True, mem_heads=2, mem_key_dim=32, mem_value_dim=32),
              dict(steps=200, lr=1e-3)),
    "hrm": (hrm(widths=(128, 128), d_model=64, head_dim=16, N=2, T=2), {}),
    "universal": (universal(widths=(128,), d_model=64, head_dim=16, steps=3), dict(lr=3e-3)),
}
