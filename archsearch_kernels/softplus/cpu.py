"""softplus(x + bias), C++ CPU kernel; same signature and return as `softplus_naive`.

Dimensions: R rows (leading axes flattened), C channels. With v = x + bias, one pass each way
(v recomputed from x and bias, nothing else saved):

    y = v > 20 ? v : max(v, 0) + log1p(exp(-|v|)),     dx = dy sigmoid(v),   dbias = sum_rows dx

Why a kernel. torch's CPU softplus computes log1p(exp(v)) with a log1p that does not vectorise
well: on a 2-core AVX2 VM it took 1.8 ms for a Mamba layer's [8, 256, 224] delta, three times a
sigmoid of the same size, with the bias add and a backward of two more passes on top. Here log1p
is a short odd series in s = w / (2 + w) (below) that the compiler vectorises with the exp, which
keeps its relative accuracy where w is far below 1. The input may be a strided view (Mamba-2's dt
columns of its input projection). Built as part of `ELEMENTWISE`
(archsearch_kernels/cpu_build.py).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from ..cpu_build import ELEMENTWISE, compare
from ..swiglu.layout import rows

SOURCE = r"""
namespace {

// softplus(v) = max(v, 0) + log1p(w), w = exp(-|v|) in (0, 1], with log1p(w) = 2 atanh(s) =
// 2 (s + s^3/3 + s^5/5 + ...) for s = w / (2 + w) in (0, 1/3]: to s^15 the series is within 2e-9
// of the whole, and it holds its relative accuracy however small w is. Selects, not std::fabs or
// std::fmax, which g++ leaves as calls that keep the loop scalar
inline float softplus_lane(float v) {
  const float w = archsearch_cpu::exp_lane(v < 0.0f ? v : -v), s = w / (2.0f + w), s2 = s * s;
  float p = 1.0f / 15.0f;
  p = p * s2 + 1.0f / 13.0f;
  p = p * s2 + 1.0f / 11.0f;
  p = p * s2 + 1.0f / 9.0f;
  p = p * s2 + 1.0f / 7.0f;
  p = p * s2 + 1.0f / 5.0f;
  p = p * s2 + 1.0f / 3.0f;
  const float log1p_w = 2.0f * s * (1.0f + s2 * p);
  return v > 20.0f ? v : (v > 0.0f ? v : 0.0f) + log1p_w;
}

}  // namespace

// x [R, C] with unit stride along C and any row stride, bias [C] -> y [R, C] contiguous
void softplus_forward(at::Tensor x, at::Tensor bias, at::Tensor y) {
  archsearch_cpu::check_float(x, "x"); archsearch_cpu::check_float(bias, "bias");
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && bias.is_contiguous() && bias.numel() == x.size(1) &&
              y.is_contiguous() && y.sizes() == x.sizes(), "softplus: x [R, C] unit stride in C, bias [C], y [R, C]");
  const int64_t R = x.size(0), C = x.size(1), sx = x.stride(0);
  const float *x_p = x.data_ptr<float>(), *b_p = bias.data_ptr<float>();
  float* y_p = y.data_ptr<float>();
  at::parallel_for(0, R, std::max<int64_t>(1, 4096 / std::max<int64_t>(C, 1)), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x_p + r * sx;
      float* out = y_p + r * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) out[c] = softplus_lane(xr[c] + b_p[c]);
    }
  });
}

// dy [R, C] contiguous, x and bias as for the forward -> dx [R, C] contiguous, dx = dy sigmoid(x + bias)
void softplus_backward(at::Tensor dy, at::Tensor x, at::Tensor bias, at::Tensor dx) {
  TORCH_CHECK(dy.is_contiguous() && dy.sizes() == x.sizes() && dx.is_contiguous() && dx.sizes() == x.sizes(),
              "softplus: dy and dx [R, C] contiguous");
  const int64_t R = x.size(0), C = x.size(1), sx = x.stride(0);
  const float *x_p = x.data_ptr<float>(), *b_p = bias.data_ptr<float>(), *dy_p = dy.data_ptr<float>();
  float* dx_p = dx.data_ptr<float>();
  at::parallel_for(0, R, std::max<int64_t>(1, 4096 / std::max<int64_t>(C, 1)), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float *xr = x_p + r * sx, *d = dy_p + r * C;
      float* out = dx_p + r * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) out[c] = d[c] / (1.0f + archsearch_cpu::exp_lane(-(xr[c] + b_p[c])));
    }
  });
}
"""


class _Softplus(torch.autograd.Function):
    """(x [R, C], bias [C]) -> softplus(x + bias) [R, C]."""

    @staticmethod
    def forward(ctx, module, x_RC: torch.Tensor, bias_C: torch.Tensor) -> torch.Tensor:
        y_RC = torch.empty(x_RC.shape, dtype=torch.float32)
        module.softplus_forward(x_RC, bias_C, y_RC)
        ctx.module = module
        ctx.save_for_backward(x_RC, bias_C)
        return y_RC

    @staticmethod
    @once_differentiable
    def backward(ctx, dy_RC: torch.Tensor):
        x_RC, bias_C = ctx.saved_tensors
        dx_RC = torch.empty(x_RC.shape, dtype=torch.float32)
        ctx.module.softplus_backward(dy_RC.contiguous(), x_RC, bias_C, dx_RC)
        return None, dx_RC, dx_RC.sum(0)


def _run(module, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return _Softplus.apply(module, rows(x.float()), bias.float().contiguous()).view(x.shape)


def softplus_cpu(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """softplus(x + bias) through the C++ kernel; matches `softplus_naive`.

    Args:
        x: [..., C] float32 CPU pre-activation (may be a strided view with a unit last stride).
        bias: [C] per-channel bias.

    Returns:
        [..., C] float32.

    Raises:
        RuntimeError: the kernel did not build or failed its check here (`ELEMENTWISE.build_error`
            says why); dispatch checks `available` first and takes the PyTorch path instead.
    """
    return _run(ELEMENTWISE.require("softplus"), x, bias)


def _self_check(module) -> str | None:
    """y and both gradients on [3, 37, 41] read from a wider tensor, over v from -100 to 100
    (exp underflowing, the threshold at 20, values near 0)."""
    from .naive import softplus_naive

    gen = torch.Generator().manual_seed(0)
    wide = torch.randn(3, 37, 45, generator=gen) * 8
    wide[0, 0, :41] = torch.linspace(-100, 100, 41)
    bias, dy = torch.randn(41, generator=gen), torch.randn(3, 37, 41, generator=gen)
    results = []
    with torch.enable_grad():  # the first call may come under no_grad
        for fn in (softplus_naive, lambda x, b: _run(module, x, b)):
            leaves = [wide.clone().requires_grad_(), bias.clone().requires_grad_()]
            y = fn(leaves[0][..., 2:43], leaves[1])
            results.append([y, *torch.autograd.grad(y, leaves, dy)])
    return compare(["y", "dx", "dbias"], *results, tolerance=1e-6)


ELEMENTWISE.add("softplus", SOURCE, ["softplus_forward", "softplus_backward"], _self_check,
                fallback="F.softplus(x + bias)")


def available() -> bool:
    """Whether the kernel compiled here and agrees with the reference (builds on first call)."""
    return ELEMENTWISE.available("softplus")


def build_error() -> str | None:
    """Why the kernel is not used, after a build; None when it is (or before the first try)."""
    return ELEMENTWISE.build_error("softplus")
