"""SwiGLU's gating product, C++ CPU kernel; same signature and return as `swiglu_naive`.

Dimensions: R rows (leading axes flattened), F width. With s = sigmoid(gate) and dh the
incoming gradient, one pass each way (s recomputed from gate, nothing else saved):

    h = gate * s * up,   d gate = dh * up * (s + gate s (1 - s)),   d up = dh * gate * s

When gate and up are the two halves of one [..., 2F] tensor, as the fused gate_up projection's
``chunk(2, -1)`` makes them, the kernel reads that tensor in place and writes the gradient of
the whole [..., 2F] tensor in one buffer, so autograd's concatenation of the halves' gradients
(one more pass over 2F) never runs. PyTorch's path (F.silu(gate) * up) takes five passes and
saves silu(gate) as well. Built as part of `ELEMENTWISE` (kernels/cpu_build.py).
"""

from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

from ..cpu_build import ELEMENTWISE, compare

SOURCE = r"""
// gate, up [R, F] with unit stride along F and any row strides -> silu(gate) * up, [R, F] contiguous
at::Tensor swiglu_forward(at::Tensor gate, at::Tensor up) {
  archsearch_cpu::check_float(gate, "gate"); archsearch_cpu::check_float(up, "up");
  TORCH_CHECK(gate.dim() == 2 && gate.sizes() == up.sizes() && gate.stride(1) == 1 && up.stride(1) == 1,
              "swiglu: gate and up must be [R, F] with unit stride along F");
  const int64_t R = gate.size(0), F = gate.size(1), sg = gate.stride(0), su = up.stride(0);
  at::Tensor h = at::empty({R, F}, gate.options());
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
  return h;
}

// dh [R, F] contiguous, gate and up as for the forward -> [R, 2F]: d gate, then d up, in each row
at::Tensor swiglu_backward(at::Tensor dh, at::Tensor gate, at::Tensor up) {
  TORCH_CHECK(dh.sizes() == gate.sizes() && dh.is_contiguous(), "swiglu: dh must be contiguous, gate's shape");
  const int64_t R = gate.size(0), F = gate.size(1), sg = gate.stride(0), su = up.stride(0);
  at::Tensor dgu = at::empty({R, 2 * F}, gate.options());
  const float *g_p = gate.data_ptr<float>(), *u_p = up.data_ptr<float>(), *dh_p = dh.data_ptr<float>();
  float* d_p = dgu.data_ptr<float>();
  at::parallel_for(0, R, 8, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float *g = g_p + r * sg, *u = u_p + r * su, *d = dh_p + r * F;
      float* dg = d_p + r * 2 * F;
      float* du = dg + F;
#pragma omp simd
      for (int64_t f = 0; f < F; ++f) {
        const float s = 1.0f / (1.0f + archsearch_cpu::exp_lane(-g[f])), gs = g[f] * s;
        du[f] = d[f] * gs;
        dg[f] = d[f] * u[f] * (s + gs * (1.0f - s));
      }
    }
  });
  return dgu;
}
"""


def _rows(x: torch.Tensor) -> torch.Tensor:
    """[..., F] -> [R, F] without a copy where the leading axes merge and F has unit stride."""
    x_RF = x.reshape(math.prod(x.shape[:-1]), x.shape[-1])  # not -1: a zero width would be ambiguous
    return x_RF if x_RF.stride(-1) == 1 else x_RF.contiguous()


class _SwiGLU(torch.autograd.Function):
    """(gate, up) -> h, the gradient as two halves of one [R, 2F] buffer."""

    @staticmethod
    def forward(ctx, module, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        gate_RF, up_RF = _rows(gate), _rows(up)
        ctx.module, ctx.shape = module, gate.shape
        ctx.save_for_backward(gate_RF, up_RF)
        return module.swiglu_forward(gate_RF, up_RF).view(gate.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, dh: torch.Tensor):
        gate_RF, up_RF = ctx.saved_tensors
        width = gate_RF.shape[1]
        dgu_R2F = ctx.module.swiglu_backward(_rows(dh).contiguous(), gate_RF, up_RF)
        return None, dgu_R2F[:, :width].view(ctx.shape), dgu_R2F[:, width:].view(ctx.shape)


class _SwiGLUPacked(torch.autograd.Function):
    """gate_up [..., 2F] -> h [..., F], its gradient written as one [..., 2F] tensor."""

    @staticmethod
    def forward(ctx, module, gate_up: torch.Tensor) -> torch.Tensor:
        gu_R2F = _rows(gate_up)
        width = gu_R2F.shape[1] // 2
        ctx.module, ctx.shape = module, gate_up.shape
        ctx.save_for_backward(gu_R2F)
        return module.swiglu_forward(gu_R2F[:, :width], gu_R2F[:, width:]).view(*gate_up.shape[:-1], width)

    @staticmethod
    @once_differentiable
    def backward(ctx, dh: torch.Tensor):
        (gu_R2F,) = ctx.saved_tensors
        width = gu_R2F.shape[1] // 2
        dgu = ctx.module.swiglu_backward(_rows(dh).contiguous(), gu_R2F[:, :width], gu_R2F[:, width:])
        return None, dgu.view(ctx.shape)


def halves_of(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor | None:
    """The [..., 2F] tensor whose first and second halves along the last axis are exactly gate
    and up (``gate, up = t.chunk(2, -1)``), or None when they are not."""
    base = gate._base
    if base is None or up._base is not base or base.dim() != gate.dim() or gate.shape != up.shape:
        return None
    width = gate.shape[-1]
    return base if (base.shape[:-1] == gate.shape[:-1] and base.shape[-1] == 2 * width
                    and gate.stride() == up.stride() == base.stride()
                    and gate.storage_offset() == base.storage_offset()
                    and up.storage_offset() == base.storage_offset() + width * base.stride(-1)) else None


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
    module = ELEMENTWISE.module("swiglu")
    if module is None:
        raise RuntimeError(f"swiglu: the C++ CPU kernel is not available here: {ELEMENTWISE.build_error('swiglu')}")
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
