"""Causal depthwise conv1d with an optional SiLU, C++ CPU kernel; same signature and return as
`causal_conv1d_naive`.

Dimensions: B batch, T time, C channels, W conv width.

Why a kernel. torch's depthwise conv wants [B, C, T], so the PyTorch path transposes the
[B, T, C] projection, pads it, convolves, transposes back and copies before the SiLU; its
backward (mkldnn's depthwise convolution_backward) is the slowest part of a Gated DeltaNet or
Mamba layer's elementwise work on a CPU. Here the conv runs in the projection's own [B, T, C]
layout, vectorised over C with the weight laid out [W, C], the SiLU fused in. Forward, one pass:

    z[t] = bias + sum_j w[j] x[t - (W - 1) + j],   y[t] = silu(z[t])

Backward, two passes: dz = dy silu'(z) with z recomputed from x; then

    dx[t] = sum_j w[j] dz[t + (W - 1) - j],   dw[j] = sum_{b,t} dz[t] x[t - (W - 1) + j],   dbias = sum dz

with dw and dbias summed per block of 64 steps of one sequence into partial rows that torch
adds, so the result does not depend on the threads' schedule. Built as part of `ELEMENTWISE`
(archsearch_kernels/cpu_build.py).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from ..cpu_build import ELEMENTWISE, compare

# steps of one sequence per block of the backward's partial dw, dbias sums
STEPS_PER_BLOCK = 64

SOURCE = r"""
namespace {

inline float silu_grad(float z) {
  const float s = 1.0f / (1.0f + archsearch_cpu::exp_lane(-z));
  return s * (1.0f + z * (1.0f - s));
}

// z at (b, t) for every channel, into out[C]: bias + sum_j w[j, c] x[b, t - (W - 1) + j, c]
inline void conv_row(const float* x_b, int64_t sxt, const float* w_WC, const float* bias, int64_t t, int64_t W,
                     int64_t C, float* out) {
  for (int64_t c = 0; c < C; ++c) out[c] = bias ? bias[c] : 0.0f;
  for (int64_t j = 0; j < W; ++j) {
    const int64_t src = t - (W - 1) + j;
    if (src < 0) continue;
    const float *xr = x_b + src * sxt, *wj = w_WC + j * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) out[c] += wj[c] * xr[c];
  }
}

}  // namespace

// x [B, T, C] (unit stride along C), weight [W, C] contiguous, bias [C] or empty -> y [B, T, C] contiguous
void causal_conv1d_forward(at::Tensor x, at::Tensor weight, at::Tensor bias, bool silu, at::Tensor y) {
  archsearch_cpu::check_float(x, "x"); archsearch_cpu::check_float(weight, "weight");
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2), W = weight.size(0);
  TORCH_CHECK(x.dim() == 3 && x.stride(2) == 1 && weight.is_contiguous() && weight.size(1) == C &&
              y.is_contiguous() && y.sizes() == x.sizes() && (bias.numel() == 0 || bias.numel() == C),
              "causal_conv1d: x [B, T, C] unit stride in C, weight [W, C], y [B, T, C] contiguous");
  const int64_t sxb = x.stride(0), sxt = x.stride(1);
  const float *x_p = x.data_ptr<float>(), *w_p = weight.data_ptr<float>();
  const float* b_p = bias.numel() ? bias.data_ptr<float>() : nullptr;
  float* y_p = y.data_ptr<float>();
  at::parallel_for(0, B * T, 16, [&](int64_t begin, int64_t end) {
    for (int64_t bt = begin; bt < end; ++bt) {
      const int64_t b = bt / T, t = bt % T;
      float* out = y_p + bt * C;
      conv_row(x_p + b * sxb, sxt, w_p, b_p, t, W, C, out);
      if (silu) {
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) out[c] = out[c] / (1.0f + archsearch_cpu::exp_lane(-out[c]));
      }
    }
  });
}

// dy [B, T, C] contiguous; x, weight, bias, silu as for the forward; dz a [B, T, C] scratch ->
// dx [B, T, C] contiguous, dweight [blocks, W, C] and dbias [blocks, C] partial sums (overwritten)
void causal_conv1d_backward(at::Tensor dy, at::Tensor x, at::Tensor weight, at::Tensor bias, bool silu,
                            int64_t steps_per_block, at::Tensor dz, at::Tensor dx, at::Tensor dweight,
                            at::Tensor dbias) {
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2), W = weight.size(0);
  const int64_t blocks_per_seq = (T + steps_per_block - 1) / steps_per_block;
  TORCH_CHECK(dy.is_contiguous() && dy.sizes() == x.sizes() && dz.is_contiguous() && dz.sizes() == x.sizes() &&
              dx.is_contiguous() && dx.sizes() == x.sizes() && dweight.is_contiguous() &&
              dweight.size(0) == B * blocks_per_seq && dbias.is_contiguous() && dbias.size(0) == B * blocks_per_seq,
              "causal_conv1d: dy, dz, dx [B, T, C] contiguous; dweight [blocks, W, C], dbias [blocks, C]");
  const int64_t sxb = x.stride(0), sxt = x.stride(1);
  const float *x_p = x.data_ptr<float>(), *w_p = weight.data_ptr<float>(), *dy_p = dy.data_ptr<float>();
  const float* b_p = bias.numel() ? bias.data_ptr<float>() : nullptr;
  float *dz_p = dz.data_ptr<float>(), *dx_p = dx.data_ptr<float>();
  float *dw_p = dweight.data_ptr<float>(), *db_p = dbias.data_ptr<float>();
  at::parallel_for(0, B * T, 16, [&](int64_t begin, int64_t end) {  // dz = dy silu'(z)
    for (int64_t bt = begin; bt < end; ++bt) {
      float* out = dz_p + bt * C;
      const float* d = dy_p + bt * C;
      if (!silu) {
        std::memcpy(out, d, C * sizeof(float));
        continue;
      }
      conv_row(x_p + (bt / T) * sxb, sxt, w_p, b_p, bt % T, W, C, out);
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) out[c] = d[c] * silu_grad(out[c]);
    }
  });
  at::parallel_for(0, B * blocks_per_seq, 1, [&](int64_t first, int64_t last) {
    for (int64_t block = first; block < last; ++block) {
      const int64_t b = block / blocks_per_seq, t0 = (block % blocks_per_seq) * steps_per_block;
      const int64_t t1 = std::min(T, t0 + steps_per_block);
      float *dw = dw_p + block * W * C, *db = db_p + block * C;
      std::fill(dw, dw + W * C, 0.0f);
      std::fill(db, db + C, 0.0f);
      const float *x_b = x_p + b * sxb, *dz_b = dz_p + b * T * C;
      for (int64_t t = t0; t < t1; ++t) {
        float* dxr = dx_p + (b * T + t) * C;
        const float* dzr = dz_b + t * C;
        std::fill(dxr, dxr + C, 0.0f);
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) db[c] += dzr[c];
        for (int64_t j = 0; j < W; ++j) {
          const int64_t later = t + (W - 1) - j, src = t - (W - 1) + j;
          const float* wj = w_p + j * C;
          float* dwj = dw + j * C;
          if (later < T) {
            const float* dzl = dz_b + later * C;
#pragma omp simd
            for (int64_t c = 0; c < C; ++c) dxr[c] += wj[c] * dzl[c];
          }
          if (src >= 0) {
            const float* xs = x_b + src * sxt;
#pragma omp simd
            for (int64_t c = 0; c < C; ++c) dwj[c] += dzr[c] * xs[c];
          }
        }
      }
    }
  });
}
"""


class _CausalConv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, module, x_BTC: torch.Tensor, weight_WC: torch.Tensor, bias_C: torch.Tensor, silu: bool):
        y_BTC = torch.empty(x_BTC.shape, dtype=x_BTC.dtype)
        module.causal_conv1d_forward(x_BTC, weight_WC, bias_C, silu, y_BTC)
        ctx.module, ctx.silu = module, silu
        ctx.save_for_backward(x_BTC, weight_WC, bias_C)
        return y_BTC

    @staticmethod
    @once_differentiable
    def backward(ctx, dy_BTC: torch.Tensor):
        x_BTC, weight_WC, bias_C = ctx.saved_tensors
        B, T, C = x_BTC.shape
        blocks = B * -(-T // STEPS_PER_BLOCK)
        dz_BTC, dx_BTC = torch.empty(B, T, C), torch.empty(B, T, C)
        dweight, dbias = torch.empty(blocks, weight_WC.shape[0], C), torch.empty(blocks, C)
        ctx.module.causal_conv1d_backward(dy_BTC.contiguous(), x_BTC, weight_WC, bias_C, ctx.silu, STEPS_PER_BLOCK,
                                          dz_BTC, dx_BTC, dweight, dbias)
        return None, dx_BTC, dweight.sum(0), dbias.sum(0) if bias_C.numel() else None, None


def causal_conv1d_cpu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                      silu: bool = False) -> torch.Tensor:
    """The causal depthwise conv (+ SiLU) through the C++ kernel; matches `causal_conv1d_naive`.

    Args:
        x: [B, T, C] float32 CPU input (any strides with a unit last one).
        weight: [C, W] one filter per channel.
        bias: [C], or None.
        silu: apply SiLU to the result.

    Returns:
        y [B, T, C] float32, contiguous.

    Raises:
        RuntimeError: the kernel did not build or failed its check here (`ELEMENTWISE.build_error`
            says why); dispatch checks `available` first and takes the PyTorch path instead.
    """
    return _run(ELEMENTWISE.require("causal_conv1d"), x, weight, bias, silu)


def _self_check(module) -> str | None:
    """y and every gradient on B 2, T 70 (a ragged second block), C 37, W 4, with and without
    bias and SiLU, from a strided input."""
    from .naive import causal_conv1d_naive

    gen = torch.Generator().manual_seed(0)
    wide, weight, bias = torch.randn(2, 70, 41, generator=gen), torch.randn(37, 4, generator=gen), torch.randn(37, generator=gen)
    dy = torch.randn(2, 70, 37, generator=gen)
    for with_bias, silu in ((True, True), (False, False)):
        results = []
        with torch.enable_grad():  # the first call may come under no_grad
            for fn in (causal_conv1d_naive, lambda *args: _run(module, *args)):
                leaves = [wide.clone().requires_grad_(), weight.clone().requires_grad_(), bias.clone().requires_grad_()]
                y = fn(leaves[0][..., 2:39], leaves[1], leaves[2] if with_bias else None, silu)
                grads = torch.autograd.grad(y, leaves[:2] + leaves[2:] * with_bias, dy)
                results.append([y, *grads])
        error = compare(["y", "dx", "dweight", "dbias"][:len(results[0])], *results)
        if error is not None:
            return error
    return None


def _run(module, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, silu: bool) -> torch.Tensor:
    x_BTC = x if x.stride(-1) == 1 else x.contiguous()
    # the [W, C] layout makes each tap a contiguous row across channels; as a differentiable
    # transpose its gradient flows back to the [C, W] weight
    bias_C = bias if bias is not None else torch.zeros(0)
    return _CausalConv.apply(module, x_BTC, weight.t().contiguous(), bias_C, bool(silu))


ELEMENTWISE.add("causal_conv1d", SOURCE, ["causal_conv1d_forward", "causal_conv1d_backward"], _self_check)


def available() -> bool:
    """Whether the kernel compiled here and agrees with the reference (builds on first call)."""
    return ELEMENTWISE.available("causal_conv1d")


def build_error() -> str | None:
    """Why the kernel is not used, after a build; None when it is (or before the first try)."""
    return ELEMENTWISE.build_error("causal_conv1d")
