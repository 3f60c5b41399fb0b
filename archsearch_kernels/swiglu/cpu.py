"""SwiGLU's gating product, C++ CPU kernel; same signature and return as `swiglu_naive`.

Dimensions: R rows (leading axes flattened), F width. With s = sigmoid(gate) and dh the
incoming gradient, one pass each way (s recomputed from gate, nothing else saved):

    h = gate * s * up,   d gate = dh * up * (s + gate s (1 - s)),   d up = dh * gate * s

When gate and up are the two halves of one [..., 2F] tensor, as the fused gate_up projection's
``chunk(2, -1)`` makes them, the kernel reads that tensor in place and writes the gradient of
the whole [..., 2F] tensor in one buffer (layout.py), so autograd's concatenation of the
halves' gradients (one more pass over 2F) never runs. PyTorch's path (F.silu(gate) * up) takes five passes and
saves silu(gate) as well. Built as part of `ELEMENTWISE` (archsearch_kernels/cpu_build.py).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from ..cpu_build import ELEMENTWISE, compare
from .layout import halves_of, rows

SOURCE = r"""
// gate, up [R, F] with unit stride along F and any row strides -> h = silu(gate) * up, [R, F] contiguous
void swiglu_forward(at::Tensor gate, at::Tensor up, at::Tensor h) {
  archsearch_cpu::check_float(gate, "gate"); archsearch_cpu::check_float(up, "up");
  TORCH_CHECK(gate.dim() == 2 && gate.sizes() == up.sizes() && gate.stride(1) == 1 && up.stride(1) == 1 &&
              h.sizes() == gate.sizes() && h.is_contiguous(), "swiglu: gate, up, h must be [R, F], unit stride along F");
  const int64_t R = gate.size(0), F = gate.size(1), sg = gate.stride(0), su = up.stride(0);
  const float *g_p = gate.data_ptr<float>(), *u_p = up.data_ptr<float>();
  float* h_p = h.data_ptr<float>();
  at::parallel_for(0, R, 8, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float *g = g_p + r * sg, *u = u_p + r * su;
      float* out = h_p + r * F;
#pragma omp simd
      for (int64_t f = 0; f < F; ++f) out[f] = g[f] / (1.0f + archsearch_cpu::exp_lane(-g[f])) * u[f];
    }
  });
}

// dh [R, F] contiguous, gate and up as for the forward -> dgate, dup: [R, F] with unit stride along
// F and one row stride between them (the halves of one [R, 2F] buffer, or two [R, F] tensors)
void swiglu_backward(at::Tensor dh, at::Tensor gate, at::Tensor up, at::Tensor dgate, at::Tensor dup) {
  TORCH_CHECK(dh.sizes() == gate.sizes() && dh.is_contiguous() && dgate.sizes() == gate.sizes() &&
              dup.sizes() == gate.sizes() && dgate.stride(1) == 1 && dup.stride(1) == 1 &&
              dgate.stride(0) == dup.stride(0), "swiglu: dh contiguous; dgate, dup [R, F] with one row stride");
  const int64_t R = gate.size(0), F = gate.size(1), sg = gate.stride(0), su = up.stride(0), sd = dgate.stride(0);
  const float *g_p = gate.data_ptr<float>(), *u_p = up.data_ptr<float>(), *dh_p = dh.data_ptr<float>();
  float *dg_p = dgate.data_ptr<float>(), *du_p = dup.data_ptr<float>();
  at::parallel_for(0, R, 8, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float *g = g_p + r * sg, *u = u_p + r * su, *d = dh_p + r * F;
      float *dg = dg_p + r * sd, *du = du_p + r * sd;
#pragma omp simd
      for (int64_t f = 0; f < F; ++f) {
        const float s = 1.0f / (1.0f + archsearch_cpu::exp_lane(-g[f])), gs = g[f] * s;
        du[f] = d[f] * gs;
        dg[f] = d[f] * u[f] * (s + gs * (1.0f - s));
      }
    }
  });
}
"""


def _forward(module, gate_RF: torch.Tensor, up_RF: torch.Tensor) -> torch.Tensor:
    h_RF = torch.empty(gate_RF.shape, dtype=gate_RF.dtype)
    module.swiglu_forward(gate_RF, up_RF, h_RF)
    return h_RF


def _backward(module, dh: torch.Tensor, gate_RF: torch.Tensor, up_RF: torch.Tensor) -> torch.Tensor:
    """d gate and d up as the two halves of one [R, 2F] tensor."""
    width = gate_RF.shape[1]
    dgu_R2F = torch.empty(gate_RF.shape[0], 2 * width, dtype=gate_RF.dtype)
    module.swiglu_backward(rows(dh).contiguous(), gate_RF, up_RF, dgu_R2F[:, :width], dgu_R2F[:, width:])
    return dgu_R2F


class _SwiGLU(torch.autograd.Function):
    """(gate, up) -> h; the two gradients are halves of one buffer."""

    @staticmethod
    def forward(ctx, module, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        gate_RF, up_RF = rows(gate), rows(up)
        ctx.module, ctx.shape = module, gate.shape
        ctx.save_for_backward(gate_RF, up_RF)
        return _forward(module, gate_RF, up_RF).view(gate.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, dh: torch.Tensor):
        gate_RF, up_RF = ctx.saved_tensors
        width = gate_RF.shape[1]
        dgu_R2F = _backward(ctx.module, dh, gate_RF, up_RF)
        return None, dgu_R2F[:, :width].view(ctx.shape), dgu_R2F[:, width:].view(ctx.shape)


class _SwiGLUPacked(torch.autograd.Function):
    """gate_up [..., 2F] -> h [..., F], its gradient written as one [..., 2F] tensor."""

    @staticmethod
    def forward(ctx, module, gate_up: torch.Tensor) -> torch.Tensor:
        gu_R2F = rows(gate_up)
        width = gu_R2F.shape[1] // 2
        ctx.module, ctx.shape = module, gate_up.shape
        ctx.save_for_backward(gu_R2F)
        return _forward(module, gu_R2F[:, :width], gu_R2F[:, width:]).view(*gate_up.shape[:-1], width)

    @staticmethod
    @once_differentiable
    def backward(ctx, dh: torch.Tensor):
        (gu_R2F,) = ctx.saved_tensors
        width = gu_R2F.shape[1] // 2
        return None, _backward(ctx.module, dh, gu_R2F[:, :width], gu_R2F[:, width:]).view(ctx.shape)


def swiglu_cpu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up through the C++ kernel; matches `swiglu_naive`.

    Args:
        gate: [..., F] float32 CPU gate pre-activation (may be a strided view).
        up: [..., F] the linear branch, same shape.

    Returns:
        h [..., F] float32.

    Raises:
        ValueError: gate and up differ in shape.
        RuntimeError: the kernel did not build or failed its check here (`ELEMENTWISE.build_error`
            says why); dispatch checks `available` first and takes the PyTorch path instead.
    """
    if gate.shape != up.shape:
        raise ValueError(f"swiglu: gate {tuple(gate.shape)} and up {tuple(up.shape)} differ in shape")
    module = ELEMENTWISE.require("swiglu")
    packed = halves_of(gate, up)
    return _SwiGLUPacked.apply(module, packed) if packed is not None else _SwiGLU.apply(module, gate, up)


def _self_check(module) -> str | None:
    """Forward and both gradients on [3, 37, 130], as halves of one tensor and apart."""
    from .naive import swiglu_naive

    gen = torch.Generator().manual_seed(0)
    gate_up, dh = torch.randn(3, 37, 260, generator=gen), torch.randn(3, 37, 130, generator=gen)
    for apart in (False, True):
        results = []
        with torch.enable_grad():  # the first call may come under no_grad
            for fn in (swiglu_naive, lambda g, u: _SwiGLU.apply(module, g, u) if apart
                       else _SwiGLUPacked.apply(module, torch.cat([g, u], -1))):
                leaf = gate_up.clone().requires_grad_()
                h = fn(*leaf.chunk(2, -1))
                results.append([h, *torch.autograd.grad(h, [leaf], dh)])
        error = compare(["h", "d gate_up"], *results)
        if error is not None:
            return error
    return None


ELEMENTWISE.add("swiglu", SOURCE, ["swiglu_forward", "swiglu_backward"], _self_check,
                fallback="F.silu(gate) * up")


def available() -> bool:
    """Whether the kernel compiled here and agrees with the reference (builds on first call)."""
    return ELEMENTWISE.available("swiglu")


def build_error() -> str | None:
    """Why the kernel is not used, after a build; None when it is (or before the first try)."""
    return ELEMENTWISE.build_error("swiglu")
