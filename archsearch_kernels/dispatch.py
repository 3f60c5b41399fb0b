"""Which implementation each op runs: the Triton kernel on CUDA tensors, PyTorch elsewhere.

One setting, the environment variable ``ARCHSEARCH_KERNELS``:

    auto       (default) Triton when the tensors are on CUDA and triton is installed, except
               for the ops in `SLOWER_ON_GPU` (measured slower than their PyTorch path); on CPU
               tensors the C++ kernel of an op that has one (`CPU_KERNELS`: the selective
               scan, the SSD scan, the gated delta rule, RMSNorm, SwiGLU, the rotary q, k, v
               heads, the short causal conv and the step sizes' softplus, each ``cpu.py``) when
               it builds here and passes its check, else PyTorch
    triton     always Triton (on a CPU only under TRITON_INTERPRET=1, for tests)
    cpp        the C++ kernel on CPU tensors for an op that has one, an error if it does not
               build; everything else as under auto
    reference  always the PyTorch path

The PyTorch path here is the one the models ran before the kernels existed (F.rms_norm,
F.silu(gate) * up, the chunked scan, logits then F.cross_entropy), so turning the kernels
off changes nothing else; the naive.py files beside each kernel are the specs they are
tested against. The C++ kernels take float32 only, and step aside inside torch.compile
(inductor fuses the same elementwise work itself) and inside a dispatch mode (FlopCounterMode,
fake tensors): other dtypes, compiled graphs and modes run the PyTorch path under every setting.

The gated delta rule has two kernels: the chunked WY form (`gated_delta/chunked_kernel.py`)
from `CHUNKED_FROM` steps on, the recurrent one (`gated_delta/kernel.py`) for shorter
sequences, where there is at most one chunk and so nothing for the chunked form to run in
parallel; each is its own op here (`gated_delta_rule_chunked`, `gated_delta_rule`), so the
preflight checks, and can turn off, either one alone. A long sequence whose chunked kernel is
off runs the recurrent kernel if that one is on.

An op a preflight check found broken on this device (`preflight`) is listed in
``ARCHSEARCH_KERNELS_DISABLE`` (comma-separated) and runs the PyTorch path whatever the
mode; being an environment variable, the list reaches worker processes started after it.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from .causal_conv import causal_conv1d_cpu, causal_conv1d_naive
from .causal_conv import cpu as causal_conv1d_cpu_kernel
from .gated_delta import cpu as gated_delta_cpu_kernel
from .gated_delta import (
    gated_delta_rule_chunked,
    gated_delta_rule_chunked_triton,
    gated_delta_rule_naive,
    gated_delta_rule_triton,
)
from .linear_cross_entropy import linear_cross_entropy_naive, linear_cross_entropy_triton
from .rmsnorm import cpu as rms_norm_cpu_kernel
from .rmsnorm import rms_norm_cpu, rms_norm_naive, rms_norm_triton
from .rope import cpu as rope_heads_cpu_kernel
from .rope import rope_heads_cpu, rope_heads_naive
from .selective_scan import cpu as selective_scan_cpu_kernel
from .selective_scan import selective_scan_chunked, selective_scan_naive, selective_scan_triton
from .softplus import cpu as softplus_cpu_kernel
from .softplus import softplus_cpu, softplus_naive
from .ssd import cpu as ssd_cpu_kernel
from .ssd import ssd_chunked, ssd_naive, ssd_triton
from .swiglu import cpu as swiglu_cpu_kernel
from .swiglu import swiglu_cpu, swiglu_naive, swiglu_triton

MODES = ("auto", "triton", "cpp", "reference")
OPS = ("rms_norm", "swiglu", "selective_scan", "gated_delta_rule", "gated_delta_rule_chunked", "ssd",
       "linear_cross_entropy")
# sequences from this length on take the chunked gated delta kernel, shorter ones the recurrent
# one. On an H200 (bf16, B 8, H 8, K = V = 128, forward and backward, benchmarks/bench_kernels_gpu.py)
# the two were level at T 16 and T 64 and the chunked one (in chunks of 64) 1.6x faster at T 256
CHUNKED_FROM = 64
# ops whose Triton kernel `auto` leaves out on CUDA, because their PyTorch path was faster on a
# GPU: the SSD kernel (the recurrent form, one program per head and block of P) took 26.2 ms
# forward and backward against the chunked PyTorch form's 11.1 ms on an H200 (bf16, B 8,
# T 2048, 32 heads of P 64, N 128). ARCHSEARCH_KERNELS=triton still runs it.
SLOWER_ON_GPU = frozenset({"ssd"})
# ops with a compiled C++ path for CPU tensors: op -> its module (available(), the op itself);
# rope_heads, causal_conv1d and softplus have no Triton kernel (on CUDA their references run)
CPU_KERNELS = {"selective_scan": selective_scan_cpu_kernel, "rms_norm": rms_norm_cpu_kernel,
               "swiglu": swiglu_cpu_kernel, "rope_heads": rope_heads_cpu_kernel,
               "causal_conv1d": causal_conv1d_cpu_kernel, "softplus": softplus_cpu_kernel, "ssd": ssd_cpu_kernel,
               "gated_delta_rule": gated_delta_cpu_kernel}
MODE_VAR, DISABLE_VAR = "ARCHSEARCH_KERNELS", "ARCHSEARCH_KERNELS_DISABLE"


def mode() -> str:
    """The current setting of ARCHSEARCH_KERNELS; a ValueError naming the choices if it is unknown."""
    value = os.environ.get(MODE_VAR, "auto").strip().lower() or "auto"
    if value not in MODES:
        raise ValueError(f"{MODE_VAR}={value!r}: must be one of {', '.join(MODES)}")
    return value


@contextmanager
def forced(setting: str) -> Iterator[None]:
    """Run a block under ``ARCHSEARCH_KERNELS=setting`` (the bench times kernels on and off)."""
    if setting not in MODES:
        raise ValueError(f"kernels: {setting!r} is not one of {', '.join(MODES)}")
    before = os.environ.get(MODE_VAR)
    os.environ[MODE_VAR] = setting
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(MODE_VAR, None)
        else:
            os.environ[MODE_VAR] = before


def disabled() -> set[str]:
    """Ops a preflight check turned off in this process and the workers it starts."""
    return {op for op in os.environ.get(DISABLE_VAR, "").split(",") if op}


def disable(op: str) -> None:
    """Run `op`'s PyTorch path from now on, here and in processes started later."""
    os.environ[DISABLE_VAR] = ",".join(sorted(disabled() | {op}))


def triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def use_triton(op: str, device: torch.device | str) -> bool:
    """Whether `op` on tensors on `device` runs its Triton kernel under the current setting."""
    setting = mode()
    if setting == "reference" or op in disabled() or op not in PAIRS:
        return False
    if setting == "triton":
        return True
    return torch.device(device).type == "cuda" and op not in SLOWER_ON_GPU and triton_installed()


def use_cpp(op: str, device: torch.device | str) -> bool:
    """Whether `op` on tensors on `device` runs its C++ CPU kernel under the current setting.

    Under auto the first call builds the kernel (once per machine, cached) and checks it; if
    that fails, auto takes the PyTorch path from then on, while cpp lets the op raise."""
    setting = mode()
    if setting in ("reference", "triton") or op in disabled() or op not in CPU_KERNELS:
        return False
    if torch.device(device).type != "cpu":
        return False
    return setting == "cpp" or CPU_KERNELS[op].available()


def _cpp_takes(op: str, *tensors: torch.Tensor) -> bool:
    """Whether `op` runs its C++ kernel on these tensors: float32, outside torch.compile and
    outside any dispatch mode (torch's FlopCounterMode, fake tensors: the mode must see the ops
    the kernel would hide), and `use_cpp` says so."""
    return (all(x.dtype == torch.float32 for x in tensors) and not torch.compiler.is_compiling()
            and torch._C._len_torch_dispatch_stack() == 0 and use_cpp(op, tensors[0].device))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last axis: [..., D] -> [..., D]."""
    if use_triton("rms_norm", x.device):
        return rms_norm_triton(x, weight, eps)
    if _cpp_takes("rms_norm", x, weight):
        return rms_norm_cpu(x, weight, eps)
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up: [..., F] x2 -> [..., F]."""
    if use_triton("swiglu", gate.device):
        return swiglu_triton(gate, up)
    if _cpp_takes("swiglu", gate, up):
        return swiglu_cpu(gate, up)
    return F.silu(gate) * up


def rope_heads(qkv: torch.Tensor, num_heads: int, cos: torch.Tensor, sin: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The fused projection [B, T, 3*H*K] as q, k (rotated) and v, each [B, H, T, K]."""
    if _cpp_takes("rope_heads", qkv):
        return rope_heads_cpu(qkv, num_heads, cos, sin)
    return rope_heads_naive(qkv, num_heads, cos, sin)


def causal_conv1d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  silu: bool = False) -> torch.Tensor:
    """Causal depthwise conv over time, SiLU optional: x [B, T, C], weight [C, W] -> [B, T, C]."""
    if _cpp_takes("causal_conv1d", x, weight, *([bias] if bias is not None else [])):
        return causal_conv1d_cpu(x, weight, bias, silu)
    return causal_conv1d_naive(x, weight, bias, silu)


def softplus(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """A step size from its pre-activation, softplus(x + bias): x [..., C], bias [C] -> [..., C] fp32."""
    if _cpp_takes("softplus", x, bias):
        return softplus_cpu(x, bias)
    return softplus_naive(x, bias)


def selective_scan(*args, **kwargs):
    """Mamba-1 selective scan; the arguments and return of `selective_scan_naive`."""
    u = args[0] if args else kwargs["u"]
    if use_triton("selective_scan", u.device):
        return selective_scan_triton(*args, **kwargs)
    if use_cpp("selective_scan", u.device):
        return selective_scan_cpu_kernel.selective_scan_cpu(*args, **kwargs)
    return selective_scan_chunked(*args, **kwargs)


def gated_delta_rule(*args, **kwargs):
    """Gated delta rule; the arguments and return of `gated_delta_rule_naive`."""
    q = args[0] if args else kwargs["q"]
    if q.shape[1] >= CHUNKED_FROM and use_triton("gated_delta_rule_chunked", q.device):
        return gated_delta_rule_chunked_triton(*args, **kwargs)
    if use_triton("gated_delta_rule", q.device):
        return gated_delta_rule_triton(*args, **kwargs)
    k, v = (args[i] if len(args) > i else kwargs[name] for i, name in ((1, "k"), (2, "v")))
    if _cpp_takes("gated_delta_rule", q, k, v):
        return gated_delta_cpu_kernel.gated_delta_rule_cpu(*args, **kwargs)
    return gated_delta_rule_chunked(*args, **kwargs)


def ssd(*args, chunk_size: int = 64, **kwargs):
    """Mamba-2 SSD scan; the arguments and return of `ssd_naive`. `chunk_size` is the chunked
    PyTorch path's chunk length; the Triton kernel keeps its own checkpoint interval."""
    x = args[0] if args else kwargs["x"]
    if use_triton("ssd", x.device):
        return ssd_triton(*args, **kwargs)
    if _cpp_takes("ssd", x):
        return ssd_cpu_kernel.ssd_cpu(*args, **kwargs)
    return ssd_chunked(*args, chunk_size=chunk_size, **kwargs)


def linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *,
                         ignore_index: int = -100) -> torch.Tensor:
    """Mean cross-entropy of ``x @ weight.T`` over the rows whose target is not `ignore_index`."""
    if use_triton("linear_cross_entropy", x.device):
        return linear_cross_entropy_triton(x, weight, targets, ignore_index=ignore_index)
    return linear_cross_entropy_naive(x, weight, targets, ignore_index=ignore_index)


class RMSNorm(nn.RMSNorm):
    """nn.RMSNorm (same parameters and state dict) whose forward goes through `rms_norm`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        eps = self.eps if self.eps is not None else torch.finfo(x.dtype).eps
        return rms_norm(x, self.weight, eps)


def _probe_inputs(op: str, device: torch.device) -> dict[str, torch.Tensor]:
    """Small non-power-of-two inputs for one op, seeded so every run checks the same thing."""
    gen = torch.Generator().manual_seed(0)

    def leaf(x: torch.Tensor) -> torch.Tensor:
        return x.to(device).requires_grad_()

    def randn(*shape: int) -> torch.Tensor:
        return leaf(torch.randn(*shape, generator=gen))

    if op == "rms_norm":
        return dict(x=randn(3, 37, 100), weight=randn(100))
    if op == "swiglu":
        return dict(gate=randn(3, 37, 130), up=randn(3, 37, 130))
    if op == "linear_cross_entropy":
        return dict(x=randn(75, 48), weight=randn(1000, 48))
    if op in ("gated_delta_rule", "gated_delta_rule_chunked"):  # T 77: three chunks of 32, the last ragged
        return dict(q=randn(2, 77, 3, 32), k=leaf(F.normalize(torch.randn(2, 77, 3, 32, generator=gen), dim=-1)),
                    v=randn(2, 77, 3, 40), g=leaf(F.logsigmoid(2 + torch.randn(2, 77, 3, generator=gen))),
                    beta=leaf(torch.rand(2, 77, 3, generator=gen)))
    if op == "ssd":  # T 77: three checkpoint intervals of 32, the last ragged; 4 heads over 2 groups
        dt = leaf(F.softplus(torch.randn(2, 77, 4, generator=gen) - 1))
        A = leaf(-torch.rand(4, generator=gen) - 0.1)
        return dict(x=randn(2, 77, 4, 24), dt=dt, A=A, B=randn(2, 77, 2, 16), C=randn(2, 77, 2, 16), D=randn(4))
    return dict(u=randn(2, 40, 77), delta=randn(2, 40, 77), A=leaf(-torch.rand(40, 16, generator=gen)),
                B=randn(2, 16, 77), C=randn(2, 16, 77), D=randn(40), z=randn(2, 40, 77))


def _call(fn: Callable, op: str, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    if op == "rms_norm":
        return fn(**inputs, eps=1e-6)
    if op == "linear_cross_entropy":
        targets = torch.arange(inputs["x"].shape[0], device=inputs["x"].device) * 13 % 1000
        return fn(**inputs, targets=targets)
    if op == "selective_scan":
        return fn(**inputs, delta_softplus=True)
    return fn(**inputs)


# op -> (its Triton kernel, its spec)
PAIRS = {
    "rms_norm": (rms_norm_triton, rms_norm_naive),
    "swiglu": (swiglu_triton, swiglu_naive),
    "selective_scan": (selective_scan_triton, selective_scan_naive),
    "gated_delta_rule": (gated_delta_rule_triton, gated_delta_rule_naive),
    "gated_delta_rule_chunked": (gated_delta_rule_chunked_triton, gated_delta_rule_naive),
    "ssd": (ssd_triton, ssd_naive),
    "linear_cross_entropy": (linear_cross_entropy_triton, linear_cross_entropy_naive),
}


def check(op: str, device: torch.device | str, *, atol: float = 1e-3) -> str | None:
    """Compile `op`'s kernel on `device` and compare its output and every gradient with the spec
    (fp32, small odd shapes); None if they agree, else one line saying what went wrong."""
    kernel, reference = PAIRS[op]
    try:
        inputs = _probe_inputs(op, torch.device(device))
        leaves = [x for x in inputs.values() if x.requires_grad]
        outs = []
        for fn in (kernel, reference):
            out = _call(fn, op, inputs)
            outs.append((out, *torch.autograd.grad(out.sum(), leaves)))
    except Exception as err:  # any failure to compile or run means: use the PyTorch path
        return f"{op}: the kernel failed on {device}: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    names = ["output", *(name for name, x in inputs.items() if x.requires_grad)]
    for name, got, want in zip(names, *outs):
        error = (got.double() - want.double()).abs().max().item()
        scale = max(1.0, want.double().abs().max().item())
        if not error <= atol * scale:  # also catches NaN
            return f"{op}: the kernel's {name} differs from the reference by {error:.2e} on {device}"
    return None


def preflight(ops: Iterable[str], device: torch.device | str) -> dict[str, str]:
    """Check each op that would run its Triton kernel on `device` once; disable every one that
    fails (it falls back to PyTorch) and return {op: why} for those."""
    failures = {}
    for op in ops:
        if not use_triton(op, device):
            continue
        reason = check(op, device)
        if reason is not None:
            disable(op)
            failures[op] = reason
    return failures


__all__ = ["CHUNKED_FROM", "CPU_KERNELS", "MODES", "OPS", "RMSNorm", "SLOWER_ON_GPU", "check", "disable", "disabled",
           "forced", "causal_conv1d", "gated_delta_rule", "linear_cross_entropy", "mode", "preflight", "rms_norm",
           "rope_heads", "selective_scan", "softplus", "ssd", "swiglu", "use_cpp", "use_triton"]
