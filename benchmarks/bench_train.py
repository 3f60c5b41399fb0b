"""Training tokens/s of Mamba, Mamba-2 and Gated DeltaNet against Transformer++, as ratios from one run.

    python benchmarks/bench_train.py [--d-model 128] [--layers 4] [--batch 8] [--seq-len 256] [--match params|width]
                                     [--families transformer,mamba,mamba2,gdn] [--profile 20]

Builds each family as the planner does (``spec_maker``, uniform MLP widths of
8/3 d where the family has an MLP). With ``--match params`` (the default) the
transformer sits at ``--d-model`` and the budget solver widens Mamba and Gated
DeltaNet to the transformer's non-embedding parameter count within 2%, as a
``match: params`` study would; ``--match width`` keeps every family at
``--d-model``. Then it times AdamW training steps of the three in interleaved
rounds, so a noisy machine slows all three alike, and prints the median
tokens/s of each and its ratio to the transformer's; beside it the same from
the process's CPU time (tokens per CPU-second over all threads), which a
machine shared with other jobs disturbs far less than the wall clock.
With ``--profile K`` it then runs ``--steps`` more steps of each family under
torch.profiler and prints each one's K ops with the most self CPU time (where a
family's step goes: the scan kernels, the conv, the projections, the norms).
With ``--free-scans`` each recurrent family's scan (selective scan, SSD, delta
rule) is replaced by a pass-through of its input, gradients still flowing to
every input: the ratios then say what the rest of each family's step costs, and
so how fast its scan would have to be for a given ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch


RECURRENT = ("mamba", "mamba2", "gdn")


def _touch(*tensors):
    """A zero that depends on every tensor, so their gradients (zeros) still flow back."""
    return sum(x.sum() for x in tensors) * 0.0


def free_selective_scan(u, delta, A, B, C, D=None, z=None, *, return_last_state=False, **_):
    y = u * D[:, None] * torch.nn.functional.silu(z) + _touch(delta, A, B, C)
    last = u.new_zeros(u.shape[0], u.shape[1], A.shape[1])
    return (y, last) if return_last_state else y


def free_ssd(x, dt, A, B, C, D=None, *, return_last_state=False, **_):
    y = x * D[:, None] + _touch(dt, A, B, C)
    last = x.new_zeros(x.shape[0], x.shape[2], x.shape[3], B.shape[-1])
    return (y, last) if return_last_state else y


def free_rule(q, k, v, g, beta, **_):
    return v + _touch(q, k, g, beta)


def free_scans(model) -> None:
    """Replace every recurrent mixer's scan in `model` by its pass-through above."""
    from archsearch.arch.blocks.gated_deltanet import GatedDeltaNet
    from archsearch.arch.blocks.mamba import Mamba
    from archsearch.arch.blocks.mamba2 import Mamba2

    for module in model.modules():
        if isinstance(module, Mamba):
            module.scan = free_selective_scan
        elif isinstance(module, Mamba2):
            module.scan = free_ssd
        elif isinstance(module, GatedDeltaNet):
            module.rule = free_rule


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per model per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--match", choices=("params", "width"), default="params",
                        help="equal non-embedding parameters (solved widths) or equal d_model")
    parser.add_argument("--profile", type=int, default=0, metavar="K",
                        help="after timing, print each family's K ops with the most self CPU time")
    parser.add_argument("--families", default="transformer,mamba,mamba2,gdn",
                        help="comma-separated, the transformer always included (the ratios' base)")
    parser.add_argument("--free-scans", action="store_true",
                        help="replace each recurrent family's scan by a pass-through (what the rest of its step costs)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    families = ("transformer", *(f for f in RECURRENT if f in args.families.split(",")))
    unknown = set(args.families.split(",")) - {"transformer", *RECURRENT}
    if unknown:
        parser.error(f"--families: unknown {sorted(unknown)}; choose from transformer, {', '.join(RECURRENT)}")

    from archsearch.arch.families import spec_maker
    from archsearch.arch.model import build_model
    from archsearch.budget import count_params
    from archsearch.budget.solve import solve
    from archsearch.space.schema import Mamba2Axes, ModelOptions

    vocab = 256
    options = ModelOptions()
    # Mamba-2 at its space's defaults (N 128, P 64, expand 2, chunk 64), as a study without mamba2 axes gets it
    mamba2 = {f"mamba2.{name}": field.default for name, field in Mamba2Axes.model_fields.items()}
    makers = {family: spec_maker({"family": family, "num_layers": args.layers, **(mamba2 if family == "mamba2" else {})},
                                 options, vocab_size=vocab)
              for family in families}
    width = args.layers * (round(options.mlp_ratio * args.d_model) // options.multiple_of * options.multiple_of)
    target = count_params(makers["transformer"](args.d_model, width))
    models, optimizers = {}, {}
    for family in families:
        if args.match == "width" or family == "transformer":
            spec = makers[family](args.d_model, width)
        else:
            spec = solve(target=target, make_spec=makers[family], measure=count_params, num_layers=args.layers,
                         head_dim=options.head_dim, mlp_ratio=options.mlp_ratio,
                         multiple_of=options.multiple_of, tolerance=0.02).spec
        models[family] = build_model(spec)
        if args.free_scans:
            free_scans(models[family])
        optimizers[family] = torch.optim.AdamW(models[family].parameters(), lr=1e-3)
        print(f"{family:<12} d_model {spec.d_model:>5}  {count_params(spec):>9,} non-embedding params")
    tokens = torch.randint(0, vocab, (args.batch, args.seq_len + 1), generator=torch.Generator().manual_seed(0))

    def step(family: str) -> None:
        logits = models[family](tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))
        optimizers[family].zero_grad(set_to_none=True)
        loss.backward()
        optimizers[family].step()

    for family in families:  # warm: first-call allocations
        step(family)
    rates: dict[str, list[float]] = {family: [] for family in families}
    cpu_rates: dict[str, list[float]] = {family: [] for family in families}
    tokens_per_round = args.steps * args.batch * args.seq_len
    for _ in range(args.rounds):
        for family in families:
            start, start_cpu = time.perf_counter(), time.process_time()
            for _ in range(args.steps):
                step(family)
            rates[family].append(tokens_per_round / (time.perf_counter() - start))
            cpu_rates[family].append(tokens_per_round / (time.process_time() - start_cpu))
    base, cpu_base = statistics.median(rates["transformer"]), statistics.median(cpu_rates["transformer"])
    print(f"match {args.match}: transformer d {args.d_model}, {args.layers} layers, B {args.batch}, T {args.seq_len}, {args.threads} threads; "
          f"{'scans free (pass-throughs); ' if args.free_scans else ''}"
          f"median of {args.rounds} interleaved rounds of {args.steps} steps; load avg {os.getloadavg()[0]:.1f}")
    for family in families:
        rate, cpu_rate = statistics.median(rates[family]), statistics.median(cpu_rates[family])
        print(f"{family:<12} {rate:>9,.0f} tokens/s   {rate / base:.2f}x transformer"
              f"   {cpu_rate:>9,.0f} tokens/CPU-s   {cpu_rate / cpu_base:.2f}x")
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        for family in families:
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(args.steps):
                    step(family)
            print(f"\n{family}: {args.steps} steps, ops by self CPU time")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.profile))


if __name__ == "__main__":
    main()
