"""Time the chunked gated delta rule against transformers' pure-PyTorch chunked function, on CPU.

    python benchmarks/bench_gdn_hf.py                                   # one layer of bench_train's GDN
    python benchmarks/bench_gdn_hf.py --batch 2 --seq-len 512 --heads 4 --head-dim 64
    python benchmarks/bench_gdn_hf.py --chunk-size 32                   # ours at another chunk length

The baseline is `torch_chunk_gated_delta_rule` of Hugging Face transformers (Qwen3-Next; the
optional ``bench`` extra) at its default chunk of 64, called on the same inputs through
`archsearch.train.bench` (which hands it q times K^1/2, since it scales q itself). Prints, per
pass (forward under no_grad; forward + backward to every input), the median milliseconds of
each over --repeats alternating runs after one warm-up, and the speed-up transformers / ours by
the wall clock and by the process's CPU time, which waiting for a core on a shared machine does
not count.

Dimensions: B batch, T time, H heads, K = V head dim.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch
from bench_scan import gdn_inputs, passes  # this folder is on sys.path when the script runs


def median_ms(fns: list[Callable[[], None]], repeats: int) -> tuple[list[float], list[float]]:
    """Median wall and CPU milliseconds of each callable, timed alternately after one warm-up each."""
    for fn in fns:
        fn()
    wall: list[list[float]] = [[] for _ in fns]
    cpu: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, wall_times, cpu_times in zip(fns, wall, cpu):
            start, start_cpu = time.perf_counter(), time.process_time()
            fn()
            wall_times.append(time.perf_counter() - start)
            cpu_times.append(time.process_time() - start_cpu)
    return [1e3 * statistics.median(t) for t in wall], [1e3 * statistics.median(t) for t in cpu]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=16, help="K = V")
    parser.add_argument("--chunk-size", type=int, default=None, help="ours only (default: picked from K and V)")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    import transformers
    from archsearch_kernels.gated_delta import gated_delta_rule_chunked

    from archsearch.train.bench import _transformers_gated_delta_rule

    print(f"torch {torch.__version__}  transformers {transformers.__version__}  threads {args.threads}"
          f"  load avg {os.getloadavg()[0]:.2f}")
    print(f"B {args.batch}  T {args.seq_len}  H {args.heads}  K = V {args.head_dim}  chunk {args.chunk_size or 'default'}"
          f"  median of {args.repeats}")
    inputs = gdn_inputs(args)
    chunking = {} if args.chunk_size is None else {"chunk_size": args.chunk_size}
    theirs, ours = passes(_transformers_gated_delta_rule, inputs), passes(gated_delta_rule_chunked, inputs, **chunking)
    print(f"{'pass':<10}{'transformers ms':>17}{'ours ms':>10}{'speed-up':>10}{'CPU-time speed-up':>19}")
    for index, label in enumerate(("forward", "fwd+bwd")):
        (their_ms, our_ms), (their_cpu, our_cpu) = median_ms([theirs[index], ours[index]], args.repeats)
        print(f"{label:<10}{their_ms:>17.1f}{our_ms:>10.1f}{their_ms / our_ms:>9.2f}x{their_cpu / our_cpu:>18.2f}x")


if __name__ == "__main__":
    main()
