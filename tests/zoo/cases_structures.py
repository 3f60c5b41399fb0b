"""Zoo cases for the looped and memory structures (contract suite: test_contract.py)."""

from archsearch.arch.spec import ArchSpec, LayerSpec


def looped(*, widths=(48, 40), loops=3, d_model=32, head_dim=8, vocab=64, **options) -> ArchSpec:
    return ArchSpec(family="transformer", vocab_size=vocab, d_model=d_model, num_heads=d_model // head_dim,
                    layers=tuple(LayerSpec(mlp_width=w) for w in widths), structure="looped",
                    options=dict(loops=loops, **options))


def memory(*, widths=(48, 40, 56), d_model=32, head_dim=8, vocab=64, tie=True, **options) -> ArchSpec:
    return ArchSpec(family="transformer", vocab_size=vocab, d_model=d_model, num_heads=d_model // head_dim,
                    layers=tuple(LayerSpec(mlp_width=w) for w in widths), structure="memory", options=options,
                    tie_embeddings=tie)


CASES = {
    "looped-1x1": looped(widths=(48,), loops=1),
    "looped-2x3": looped(),
    "looped-2x3-inject": looped(inject=True),
    "looped-1x3-exit-gate": looped(widths=(40,), exit_gate=True),
    # 0.9: no token exits at init (every lambda is near 0.5), so the counter sees every loop, as the
    # analytic count (an upper bound once tokens exit) assumes; exits are tested in test_looped_options.py
    "looped-2x3-inject-exit-threshold": looped(inject=True, exit_gate=True, exit_threshold=0.9),
    "looped-2x3-exit-threshold-entropy": looped(widths=(40, 32), exit_gate=True, exit_threshold=0.95,
                                                exit_entropy=0.2),
    "looped-2x3-cache-hole": looped(exit_gate=True, cache_hole=0.5),
    "memory-after-0-slots3-segment5": memory(placement=0, slots=3, segment=5),
    "memory-after-1-slots5-segment7-dim24-heads3-untied": memory(placement=1, slots=5, segment=7, memory_dim=24,
                                                                memory_heads=3, tie=False),
    "memory-after-last-slots1-segment40": memory(placement=2, slots=1, segment=40),
    "memory-defaults-d48": memory(d_model=48),
    "memory-aux-self-segment7": memory(slots=3, segment=7, aux="self"),
    "memory-aux-random-segment7": memory(slots=3, segment=7, aux="random", aux_weight=1.0),
    "memory-carry-segment7": memory(slots=3, segment=7, carry=True),
    "memory-carry-aux-self-segment8-heads2": memory(slots=2, segment=8, memory_dim=16, memory_heads=2, carry=True,
                                                   aux="self"),
}

LEARN = {
    "looped": (looped(widths=(128,), loops=2, d_model=64, head_dim=16, inject=True, exit_gate=True), {}),
    "memory": (memory(widths=(128, 128), d_model=64, head_dim=16, placement=0, slots=4, segment=8), {}),
}
