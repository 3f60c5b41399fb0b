"""Rotary q and k from the fused projection, C++ CPU kernel; same signature and return as
`rope_heads_naive`.

Dimensions: B batch, T time, H heads, K head dim; the projection's row is [3, H, K].

Forward, one pass over the projection: each (b, t) row's q and k heads are rotated and written
to contiguous [B, H, T, K] q and k, and v is copied to its own [B, H, T, K]. Backward, one pass
the other way: the incoming dq and dk are rotated back (the transpose of a rotation is the
rotation by minus the angle) and written with dv straight into the projection's [B, T, 3, H, K]
gradient. PyTorch's path builds the rotation from slices, products and a concatenation, and its
backward adds the slices' gradients into a zero-filled projection gradient, about a dozen passes
in all; this is two, and it saves only the tables. 3.6x faster forward and backward at d 128
and 3.1x at d 512 (benchmarks/bench_cpu_kernels.py, docs/performance.md). Built as part of
`ELEMENTWISE` (archsearch_kernels/cpu_build.py).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from ..cpu_build import ELEMENTWISE, compare

SOURCE = r"""
// qkv [B, T, 3 H K] (unit stride along the last axis), cos, sin [T, K/2] contiguous
// -> q, k rotated and v, each [B, H, T, K] contiguous, written into the given tensors
void rope_heads_forward(at::Tensor qkv, int64_t H, at::Tensor cos, at::Tensor sin, at::Tensor q, at::Tensor k,
                        at::Tensor v) {
  archsearch_cpu::check_float(qkv, "qkv"); archsearch_cpu::check_float(cos, "cos"); archsearch_cpu::check_float(sin, "sin");
  TORCH_CHECK(qkv.dim() == 3 && qkv.stride(2) == 1 && qkv.size(2) % (3 * H) == 0, "rope: qkv must be [B, T, 3 H K], unit stride last");
  const int64_t B = qkv.size(0), T = qkv.size(1), K = qkv.size(2) / (3 * H), half = K / 2;
  TORCH_CHECK(K % 2 == 0 && cos.is_contiguous() && sin.is_contiguous() && cos.size(0) == T && cos.size(1) == half,
              "rope: the tables must be [T, K/2] contiguous, K even");
  for (const at::Tensor* out : {&q, &k, &v}) {
    TORCH_CHECK(out->dim() == 4 && out->size(0) == B && out->size(1) == H && out->size(2) == T && out->size(3) == K &&
                out->is_contiguous(), "rope: q, k, v must be [B, H, T, K] contiguous");
  }
  const int64_t sb = qkv.stride(0), st = qkv.stride(1);
  const float *x_p = qkv.data_ptr<float>(), *c_p = cos.data_ptr<float>(), *s_p = sin.data_ptr<float>();
  float* outs[3] = {q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>()};
  at::parallel_for(0, B * T, 4, [&](int64_t begin, int64_t end) {
    for (int64_t bt = begin; bt < end; ++bt) {
      const int64_t b = bt / T, t = bt % T;
      const float *c = c_p + t * half, *s = s_p + t * half, *row = x_p + b * sb + t * st;
      for (int64_t h = 0; h < H; ++h) {
        const int64_t at_out = ((b * H + h) * T + t) * K;
        for (int j = 0; j < 2; ++j) {
          const float* x = row + (j * H + h) * K;
          float* y = outs[j] + at_out;
#pragma omp simd
          for (int64_t i = 0; i < half; ++i) {
            const float x1 = x[i], x2 = x[i + half];
            y[i] = x1 * c[i] - x2 * s[i];
            y[i + half] = x1 * s[i] + x2 * c[i];
          }
        }
        std::memcpy(outs[2] + at_out, row + (2 * H + h) * K, K * sizeof(float));
      }
    }
  });
}

// dq, dk, dv [B, H, T, K] (unit stride along K), the tables -> the projection's gradient dqkv
// [B, T, 3 H K] contiguous, written into the given tensor
void rope_heads_backward(at::Tensor dq, at::Tensor dk, at::Tensor dv, at::Tensor cos, at::Tensor sin, at::Tensor dqkv) {
  const int64_t B = dq.size(0), H = dq.size(1), T = dq.size(2), K = dq.size(3), half = K / 2;
  const at::Tensor* grads[3] = {&dq, &dk, &dv};
  const float* g_p[3];
  int64_t strides[3][3];
  for (int j = 0; j < 3; ++j) {
    TORCH_CHECK(grads[j]->sizes() == dq.sizes() && grads[j]->stride(3) == 1, "rope: dq, dk, dv must be [B, H, T, K], unit stride in K");
    g_p[j] = grads[j]->data_ptr<float>();
    for (int a = 0; a < 3; ++a) strides[j][a] = grads[j]->stride(a);
  }
  TORCH_CHECK(dqkv.is_contiguous() && dqkv.numel() == B * T * 3 * H * K, "rope: dqkv must be [B, T, 3 H K] contiguous");
  const float *c_p = cos.data_ptr<float>(), *s_p = sin.data_ptr<float>();
  float* d_p = dqkv.data_ptr<float>();
  at::parallel_for(0, B * T, 4, [&](int64_t begin, int64_t end) {
    for (int64_t bt = begin; bt < end; ++bt) {
      const int64_t b = bt / T, t = bt % T;
      const float *c = c_p + t * half, *s = s_p + t * half;
      for (int j = 0; j < 3; ++j) {
        for (int64_t h = 0; h < H; ++h) {
          const float* g = g_p[j] + b * strides[j][0] + h * strides[j][1] + t * strides[j][2];
          float* y = d_p + (bt * 3 + j) * H * K + h * K;
          if (j == 2) {
            std::memcpy(y, g, K * sizeof(float));
            continue;
          }
#pragma omp simd
          for (int64_t i = 0; i < half; ++i) {
            const float g1 = g[i], g2 = g[i + half];
            y[i] = g1 * c[i] + g2 * s[i];
            y[i + half] = g2 * c[i] - g1 * s[i];
          }
        }
      }
    }
  });
}
"""


class _RopeHeads(torch.autograd.Function):
    @staticmethod
    def forward(ctx, module, qkv: torch.Tensor, num_heads: int, cos: torch.Tensor, sin: torch.Tensor):
        B, T, width = qkv.shape
        q, k, v = (torch.empty(B, num_heads, T, width // (3 * num_heads), dtype=qkv.dtype) for _ in range(3))
        module.rope_heads_forward(qkv, num_heads, cos, sin, q, k, v)
        ctx.module = module
        ctx.save_for_backward(cos, sin)
        return q, k, v

    @staticmethod
    @once_differentiable
    def backward(ctx, dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor):
        cos, sin = ctx.saved_tensors

        def unit_last(g: torch.Tensor | None, like: torch.Tensor | None) -> torch.Tensor:
            if g is None:  # an output the loss did not use
                return torch.zeros_like(like)
            return g if g.stride(-1) == 1 else g.contiguous()

        like = next(g for g in (dq, dk, dv) if g is not None)
        B, H, T, K = like.shape
        dqkv = torch.empty(B, T, 3 * H * K, dtype=like.dtype)
        ctx.module.rope_heads_backward(unit_last(dq, like), unit_last(dk, like), unit_last(dv, like), cos, sin, dqkv)
        return None, dqkv, None, None, None


def rope_heads_cpu(qkv: torch.Tensor, num_heads: int, cos: torch.Tensor, sin: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The fused projection as rotated q, k and v per head, through the C++ kernel; matches
    `rope_heads_naive`.

    Args:
        qkv: [B, T, 3*H*K] float32 CPU (any strides with a unit last one).
        num_heads: H.
        cos: [T, K/2] from `rope_tables`.
        sin: [T, K/2].

    Returns:
        (q, k, v), each [B, H, T, K] float32, contiguous.

    Raises:
        RuntimeError: the kernel did not build or failed its check here (`ELEMENTWISE.build_error`
            says why); dispatch checks `available` first and takes the PyTorch path instead.
    """
    module = ELEMENTWISE.require("rope_heads")
    x = qkv if qkv.stride(-1) == 1 else qkv.contiguous()
    return _RopeHeads.apply(module, x, num_heads, cos.float().contiguous(), sin.float().contiguous())


def _self_check(module) -> str | None:
    """q, k, v and the projection's gradient on B 2, T 37, H 3, K 32, from a strided projection."""
    from .naive import rope_heads_naive, rope_tables

    gen = torch.Generator().manual_seed(0)
    wide = torch.randn(2, 37, 3 * 3 * 32 + 5, generator=gen)  # a split of a wider projection
    cotangents = [torch.randn(2, 3, 37, 32, generator=gen) for _ in range(3)]
    cos, sin = rope_tables(37, 32, 10000.0, torch.device("cpu"))
    results = []
    with torch.enable_grad():  # the first call may come under no_grad
        for fn in (rope_heads_naive, lambda *args: _RopeHeads.apply(module, *args)):
            leaf = wide.clone().requires_grad_()
            outs = fn(leaf[..., :-5], 3, cos, sin)
            results.append([*outs, *torch.autograd.grad(outs, [leaf], cotangents)])
    return compare(["q", "k", "v", "d qkv"], *results)


ELEMENTWISE.add("rope_heads", SOURCE, ["rope_heads_forward", "rope_heads_backward"], _self_check)


def available() -> bool:
    """Whether the kernel compiled here and agrees with the reference (builds on first call)."""
    return ELEMENTWISE.available("rope_heads")


def build_error() -> str | None:
    """Why the kernel is not used, after a build; None when it is (or before the first try)."""
    return ELEMENTWISE.build_error("rope_heads")
