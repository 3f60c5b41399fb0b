"""Compile the chunked gated delta rule kernels for an H100 / H200 (sm_90) on a machine without a GPU.

    python benchmarks/compile_gated_delta_sm90.py                         # K = V = 128, chunks of 64, bf16
    python benchmarks/compile_gated_delta_sm90.py --key-dim 64 --chunk 32 --dtype float32

The interpreter the tests use checks the maths but not what a GPU refuses: more shared
memory than a block may have, or registers spilled to the stack. This lowers each kernel
with the launch settings the wrapper uses (`_sizes`, `LAUNCH`, `_precision` of
archsearch_kernels/gated_delta/chunked_kernel.py) through triton.compile and the ptxas that ships with
triton, reads the cubin's resource use with cuobjdump, prints one line per kernel and exits 1
if any kernel wants more shared memory than --shared-kb. Needs triton, no GPU. Run it without
TRITON_INTERPRET (the script unsets it for itself).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

os.environ.pop("TRITON_INTERPRET", None)  # triton.compile needs real JIT functions
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

import torch  # noqa: E402
import triton  # noqa: E402
from archsearch_kernels.gated_delta import chunked_kernel  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

# pointers that hold the caller's dtype; every other buffer the wrapper makes is fp32
INPUT_DTYPE_POINTERS = {"q_ptr", "k_ptr", "v_ptr", "o_ptr", "do_ptr", "dq_ptr", "dk_ptr", "dv_ptr"}
TRITON_TYPES = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32"}
KERNELS = [  # kernel, its LAUNCH entry, its extra constexprs
    ("_fwd_prepare", "prepare", {}),
    ("_fwd_states", "states", {"HAS_INIT": True}),
    ("_fwd_output", "output", {}),
    ("_bwd_states", "states", {"HAS_DLAST": True}),
    ("_bwd_chunk", "chunk", {}),
]


def resources(cubin: bytes) -> str:
    """cuobjdump's resource line (REG, STACK, ...) for a cubin."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    line = next((line.strip() for line in out.splitlines() if "REG:" in line), "")
    return " ".join(part for part in line.split() if part.split(":")[0] in ("REG", "STACK"))


def compile_one(name: str, launch: str, extra: dict, *, sizes: dict, dtype: torch.dtype, target: GPUTarget):
    fn = getattr(chunked_kernel, name)
    constexprs = {**sizes, **extra}
    signature = {arg: "constexpr" if arg in constexprs
                 else (TRITON_TYPES[dtype] if arg in INPUT_DTYPE_POINTERS else "*fp32") if arg.endswith("_ptr")
                 else "i32" for arg in fn.arg_names}
    source = ASTSource(fn=fn, signature=signature, constexprs={(fn.arg_names.index(k),): v for k, v in constexprs.items()})
    return triton.compile(source, target=target, options=chunked_kernel.LAUNCH[launch])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--key-dim", type=int, default=128)
    parser.add_argument("--value-dim", type=int, default=128)
    parser.add_argument("--chunk", type=int, default=chunked_kernel.CHUNK)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--arch", type=int, default=90, help="compute capability, 90 for H100 / H200")
    parser.add_argument("--shared-kb", type=float, default=227.0, help="shared memory a block may have (sm_90: 227)")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    block_k, block_v = chunked_kernel._sizes(args.key_dim, args.value_dim, args.chunk)
    sizes = dict(L=args.chunk, BK=block_k, BV=block_v, PRECISION=chunked_kernel._precision(dtype))
    print(f"sm_{args.arch}  K {args.key_dim}  V {args.value_dim}  L {args.chunk}  BK {block_k}  BV {block_v}  "
          f"{args.dtype} ({sizes['PRECISION']} dots)", flush=True)
    too_big = []
    for name, launch, extra in KERNELS:
        kernel = compile_one(name, launch, extra, sizes=sizes, dtype=dtype, target=GPUTarget("cuda", args.arch, 32))
        shared_kb = kernel.metadata.shared / 1024
        print(f"{name:14s} shared {shared_kb:6.1f} KB  warps {kernel.metadata.num_warps}  "
              f"{resources(kernel.asm['cubin'])}", flush=True)
        if shared_kb > args.shared_kb:
            too_big.append(name)
    if too_big:
        print(f"over {args.shared_kb} KB of shared memory: {', '.join(too_big)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
