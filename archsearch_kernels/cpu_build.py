"""Building the C++ CPU kernels: one extension per group of ops, compiled on first use.

An op's ``cpu.py`` holds its C++ source and registers it with an `Extension` (`add`); the
extension compiles every registered part into one module the first time any of its ops is
needed, so ops that are used together pay for one compile: RMSNorm, SwiGLU, the rotary heads,
the short causal conv and the step sizes' softplus share `ELEMENTWISE` (about 20 s on a 2-core machine, once), the
selective scan and Mamba-2's SSD scan have their own (selective_scan/cpu.py, ssd/cpu.py).

Compiling goes through torch.utils.cpp_extension.load_inline (g++ and ninja) into torch's
extension cache, under a name and folder that carry everything the build depends on
(archsearch_kernels/cpu_cache.py): each Python environment builds once, a second process that needs the same
build meanwhile waits for the first, and every build says before it starts what it compiles and
about how long it takes. `build_all` (``archsearch kernels build``) builds them ahead of use.
Before first use each op's part is checked against its PyTorch reference on small odd shapes. An
op that fails its check, or every op of an extension that does not compile, is not used:
`available(op)` is False, `build_error(op)` says why, one RuntimeWarning says so, and dispatch
runs the PyTorch path.

Flags: -O3 with the CPU's vector ISA, -ffp-contract=fast (fused multiply-adds) and
-fno-trapping-math, without which g++ will not if-convert the clamps of `exp_lane` below and
leaves every loop that calls it scalar (checked with -fopt-info-vec; SwiGLU's kernel was 2x slower).
"""

from __future__ import annotations

import importlib
import sys
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .cpu_cache import (EXTENSIONS, HERE, build_lock, build_name, expected_seconds, is_built, record_inputs,
                        record_seconds, remove_stale_builds)

ARCH_FLAGS = {
    "AVX512": ["-mavx512f", "-mavx512dq", "-mavx512vl", "-mavx512bw", "-mavx2", "-mfma", "-mprefer-vector-width=512"],
    "AVX2": ["-mavx2", "-mfma"],
}

# prepended to every extension's source: the headers, a vectorisable exp and cache-line-aligned scratch
PRELUDE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>  // the scans' AVX-512 and AVX2 shuffles
#endif

namespace archsearch_cpu {

// exp for vector lanes: Cephes' expf. x = k ln2 + r, |r| <= ln2 / 2, exp(r) by a degree-6
// polynomial, 2^k put straight into the exponent bits. Relative error under 1e-7 on
// [-87, 88] (checked against double exp), exactly 1 at x = 0, 0 below -87.
inline float exp_lane(float x) {
  const float lo = -87.0f, hi = 88.0f;
  float xc = x < lo ? lo : (x > hi ? hi : x);
  // k = round(x / ln2) by the 1.5 * 2^23 shift (floor does not vectorise without -ffast-math)
  const float shifter = 12582912.0f;
  const float k = (xc * 1.44269504088896341f + shifter) - shifter;
  float r = xc - k * 0.693359375f;
  r = r + k * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t bits = (static_cast<int32_t>(k) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(float));
  float out = p * scale;
  out = x < lo ? 0.0f : out;
  return x > hi ? INFINITY : out;
}

// n floats aligned to a cache line, so that no 64-byte vector of them straddles two lines (one that
// does costs two loads or stores; malloc's large blocks start 16 bytes past a line)
class Lines {
 public:
  explicit Lines(int64_t n)
      : raw_(n + 16), at_(reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(raw_.data()) + 63) & ~uintptr_t{63})) {}
  Lines(const Lines&) = delete;
  Lines& operator=(const Lines&) = delete;
  float* data() { return at_; }
  const float* data() const { return at_; }
  float& operator[](int64_t i) { return at_[i]; }

 private:
  std::vector<float> raw_;
  float* at_;
};

inline void check_float(const at::Tensor& x, const char* name) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.device().is_cpu(), name, ": expected a float32 CPU tensor");
}

}  // namespace archsearch_cpu
"""


def capability() -> str:
    """This CPU's vector capability as torch reports it (AVX512, AVX2, DEFAULT)."""
    try:
        return torch.backends.cpu.get_cpu_capability()
    except Exception:  # older torch: build for the baseline ISA
        return "DEFAULT"


_ALL: list[Extension] = []  # every extension made, in order (build_all builds them)


@dataclass(frozen=True)
class _Part:
    source: str
    functions: tuple[str, ...]
    # runs the compiled module against the op's reference; None if they agree, else why not
    self_check: Callable[[object], str | None]
    fallback: str  # what runs instead, for the warning


class Extension:
    """A group of ops' C++ sources, compiled together into one module on first use."""

    def __init__(self, name: str):
        self.name = name
        self._parts: dict[str, _Part] = {}
        self._lock = threading.Lock()
        self._state: dict[str, object] = {}  # "module", and per op "error:<op>"
        _ALL.append(self)

    @property
    def ops(self) -> list[str]:
        """The ops registered so far."""
        return list(self._parts)

    def add(self, op: str, source: str, functions: list[str], self_check: Callable[[object], str | None], *,
            fallback: str = "the PyTorch path") -> None:
        """Register `op`'s C++ source (its `functions` are bound in the module), before the first build."""
        if "module" in self._state:
            raise RuntimeError(f"{self.name}: {op} was added after the extension was built")
        self._parts[op] = _Part(source, tuple(functions), self_check, fallback)

    def _compile(self):
        """Compile (or load the cached build of) every registered part, for this machine's vector ISA."""
        from torch.utils.cpp_extension import load_inline

        isa = capability()
        flags = ["-O3", "-fopenmp", "-ffp-contract=fast", "-fno-trapping-math", *ARCH_FLAGS.get(isa, [])]
        name = build_name(self.name, isa)
        sources = [PRELUDE, *(part.source for part in self._parts.values())]
        functions = [fn for part in self._parts.values() for fn in part.functions]
        with build_lock(name, say=_say) as folder, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if is_built(self.name, isa):  # built before, or by the process this one waited for
                return load_inline(name=name, cpp_sources=sources, functions=functions, extra_cflags=flags,
                                   extra_ldflags=["-fopenmp"], build_directory=str(folder), verbose=False)
            seconds, measured = expected_seconds(self.name)
            _say(f"archsearch: compiling the C++ CPU kernels ({EXTENSIONS.get(self.name, self.name)}) for this "
                 f"Python environment, once: about {seconds} s{' as the last build here took' if measured else ''}, "
                 "longer on a busy machine")
            began = time.monotonic()
            module = load_inline(name=name, cpp_sources=sources, functions=functions, extra_cflags=flags,
                                 extra_ldflags=["-fopenmp"], build_directory=str(folder), verbose=False)
            record_seconds(self.name, time.monotonic() - began)
            record_inputs(self.name, folder)
            _say(f"archsearch: compiled {EXTENSIONS.get(self.name, self.name)} in {time.monotonic() - began:.0f} s")
        remove_stale_builds(keep=name, say=_say)
        return module

    def _load_locked(self) -> None:
        module, build_error = None, None
        try:
            module = self._compile()
        except Exception as err:  # no compiler, a failed build, a broken toolchain: use PyTorch
            text = str(err).strip()
            build_error = f"{type(err).__name__}: {text.splitlines()[-1] if text else ''}"
        for op, part in self._parts.items():
            error = build_error
            if error is None:
                try:
                    error = part.self_check(module)
                except Exception as err:
                    error = f"its check raised {type(err).__name__}: {err}"
            if error is not None:
                warnings.warn(f"{op}: the C++ CPU kernel is not used ({error}); falling back to {part.fallback}",
                              RuntimeWarning, stacklevel=4)
            self._state[f"error:{op}"] = error
        self._state["module"] = module

    def module(self, op: str):
        """The compiled module if `op` built and passed its check (building on first call), else None."""
        if "module" not in self._state:  # built once; every later call (each op of each forward) skips the lock
            with self._lock:
                if "module" not in self._state:
                    self._load_locked()
        return None if self._state.get(f"error:{op}") is not None else self._state["module"]

    def require(self, op: str):
        """The compiled module for `op`; a RuntimeError saying why when it cannot be used here
        (the C++ forms call this; dispatch checks `available` first and takes PyTorch instead)."""
        module = self.module(op)
        if module is None:
            raise RuntimeError(f"{op}: the C++ CPU kernel is not available here: {self.build_error(op)}")
        return module

    def available(self, op: str) -> bool:
        """Whether `op`'s kernel compiled here and agrees with its reference (builds on first call)."""
        return self.module(op) is not None

    def build_error(self, op: str) -> str | None:
        """Why `op`'s kernel is not used, after a build; None when it is (or before the first try)."""
        return self._state.get(f"error:{op}")  # type: ignore[return-value]


def compare(names: list[str], want: list[torch.Tensor], got: list[torch.Tensor], tolerance: float = 1e-4) -> str | None:
    """None if each pair agrees to `tolerance` (relative to the reference's largest entry), else which does not."""
    for name, w, g in zip(names, want, got):
        if w.shape != g.shape:
            return f"{name} has shape {tuple(g.shape)}, the reference {tuple(w.shape)}"
        scale = max(1.0, w.double().abs().max().item()) if w.numel() else 1.0
        error = (w.double() - g.double()).abs().max().item() / scale if w.numel() else 0.0
        if not torch.isfinite(g).all():
            error = float("inf")
        if not error <= tolerance:
            return f"{name} differs from the reference by {error:.2e}"
    return None


def compare_scans(reference: Callable, kernel: Callable, inputs: dict[str, torch.Tensor], *, output: str,
                  **kwargs) -> str | None:
    """A scan's self-check: ``reference`` and ``kernel`` called on ``inputs`` (and ``kwargs``)
    with ``return_last_state=True`` give the same output (named ``output`` in the reason), last
    state and gradient of every input (through out.sum() + last.square().sum()); None if they
    agree, else which differs."""
    leaves = {name: x.detach().requires_grad_() for name, x in inputs.items()}
    results = []
    with torch.enable_grad():  # the first call may come under no_grad
        for fn in (reference, kernel):
            out, last = fn(**leaves, **kwargs, return_last_state=True)
            results.append((out, last, *torch.autograd.grad(out.sum() + last.square().sum(), list(leaves.values()))))
    return compare([output, "last_state", *leaves], *results)


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def build_all(*, only: list[str] | None = None) -> dict[str, str | None]:
    """Build (or load) every C++ CPU extension, or those named in `only`, and check each op;
    returns {op: None if it is used, else why not}. What ``archsearch kernels build`` runs."""
    for path in sorted(HERE.glob("*/cpu.py")):  # each op's module registers its part on import
        importlib.import_module(f"{__package__}.{path.parent.name}.cpu")
    outcome = {}
    for extension in _ALL:
        if extension.name in (only if only is not None else EXTENSIONS):
            outcome.update({op: extension.build_error(op) if not extension.available(op) else None
                            for op in extension.ops})
    return outcome


# the elementwise kernels (RMSNorm, SwiGLU, rotary heads, causal conv, softplus): one compile for all
ELEMENTWISE = Extension("elementwise")

__all__ = ["ELEMENTWISE", "Extension", "PRELUDE", "build_all", "capability", "compare"]
