"""Mamba-2 SSD scan, C++ CPU kernel: the loop of naive.py compiled, the [P, N] state in cache.

Same signature and return as `ssd_naive`; see tests/kernels/test_ssd_cpu.py. Dimensions: B batch,
T time, H heads, P head dim, G groups (head h reads group h // (H / G)), N state size.

Why a compiled loop. On a CPU the chunked PyTorch form (chunked.py) is bound by memory and by
the count of ops: per chunk it builds [B, H, L, L] decay masks, [B, H, P, N] chunk states and
their autograd graph, dozens of small tensors a step. The recurrence itself is 2 P N multiply-adds
a head and step. This kernel walks t = 0..T-1 for one (batch, head) at a time with the [P, N]
state (16 KiB at P = N = 64) in L1, reading x, dt, B and C once; the (batch, head) pairs are
spread over torch's threads (at::parallel_for) and the loop over N is vectorised.

    a_t = exp(dt_t A);   S_t = a_t S_{t-1} + (dt_t x_t) B_t^T;   y_t = S_t C_t

Backward, per (batch, head): the forward is rerun, keeping the state at the start of every
`SPAN` steps (T / SPAN states), then each span backward from the last: the states before each of
its steps are recomputed from its start into a scratch (SPAN x P x N floats, 256 KiB at 64 x 64,
in L2), and walked backward carrying dS; the state after a step is formed again from the one
before it as the walk needs it, which costs a multiply-add and saves keeping and reading it:

    g = dS + dy_t C_t^T;   dC_t += S_t^T dy_t;   du_t = g B_t;   dB_t += g^T u_t   (u_t = dt_t x_t)
    dx_t = dt_t du_t;   d dt_t = <du_t, x_t> + <g, S_{t-1}> a_t A;   dA += <g, S_{t-1}> a_t dt_t
    dS = a_t g

B and C are shared by a group's heads, so each head writes its own dB, dC [B, T, H, N] and torch
sums a group's heads (and dA over the batch), which keeps the result independent of scheduling.
The skip D x stays in PyTorch around the kernel, differentiated by autograd.

Building: `SSD` (archsearch_kernels/cpu_build.py) compiles the source below on first use, once per Python
environment, and checks it against the reference on small odd shapes. If it does not compile or
does not agree, `available()` is False, the reason is in `build_error()`, and dispatch falls back
to the chunked PyTorch form (archsearch_kernels/dispatch.py).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from ..cpu_build import Extension, compare_scans

# steps between the states the backward keeps: SPAN recomputed states stay in L2
SPAN = 16

SOURCE = r"""
namespace {

struct Ssd {  // sizes and the group of a head; x [B, T, H, P], dt [B, T, H], Bm, Cm [B, T, G, N]
  int64_t batch, steps, heads, P, groups, N;
  int64_t x_at(int64_t b, int64_t t, int64_t h) const { return ((b * steps + t) * heads + h) * P; }
  int64_t dt_at(int64_t b, int64_t t, int64_t h) const { return (b * steps + t) * heads + h; }
  int64_t bc_at(int64_t b, int64_t t, int64_t h) const {
    return ((b * steps + t) * groups + h / (heads / groups)) * N;
  }
  int64_t head_at(int64_t b, int64_t t, int64_t h) const { return ((b * steps + t) * heads + h) * N; }
};

void check(const at::Tensor& x, const char* name, int64_t dim) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.device().is_cpu() && x.dim() == dim && x.is_contiguous(),
              name, ": expected a contiguous float32 CPU tensor of ", dim, " dims");
}

Ssd sizes(const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A, const at::Tensor& Bm,
          const at::Tensor& Cm, const at::Tensor& S0) {
  check(x, "x", 4); check(dt, "dt", 3); check(A, "A", 1); check(Bm, "B", 4); check(Cm, "C", 4);
  check(S0, "initial_state", 4);
  Ssd s{x.size(0), x.size(1), x.size(2), x.size(3), Bm.size(2), Bm.size(3)};
  TORCH_CHECK(s.heads % s.groups == 0, "heads must split evenly over groups");
  TORCH_CHECK(Cm.sizes() == Bm.sizes(), "C must have B's shape");
  return s;
}

// S = a S + u B^T for the steps [t0, t1) of one (batch, head)
void advance(const Ssd& s, float* S, const float* x_p, const float* dt_p, float A, const float* B_p,
             int64_t b, int64_t h, int64_t t0, int64_t t1) {
  const int64_t N = s.N, P = s.P;
  for (int64_t t = t0; t < t1; ++t) {
    const float dt = dt_p[s.dt_at(b, t, h)], a = std::exp(dt * A);
    const float *x_t = x_p + s.x_at(b, t, h), *B_t = B_p + s.bc_at(b, t, h);
    for (int64_t p = 0; p < P; ++p) {
      const float u = dt * x_t[p];
      float* row = S + p * N;
#pragma omp simd
      for (int64_t n = 0; n < N; ++n) row[n] = a * row[n] + u * B_t[n];
    }
  }
}

}  // namespace

// x [B, T, H, P], dt [B, T, H] (positive), A [H], Bm, Cm [B, T, G, N], S0 [B, H, P, N]
// -> y [B, T, H, P] (S_t C_t, no skip) and the last state [B, H, P, N]
std::vector<at::Tensor> ssd_forward(at::Tensor x, at::Tensor dt, at::Tensor A, at::Tensor Bm, at::Tensor Cm,
                                    at::Tensor S0) {
  const Ssd s = sizes(x, dt, A, Bm, Cm, S0);
  at::Tensor y = at::empty_like(x), last = at::empty_like(S0);
  const float *x_p = x.data_ptr<float>(), *dt_p = dt.data_ptr<float>(), *A_p = A.data_ptr<float>();
  const float *B_p = Bm.data_ptr<float>(), *C_p = Cm.data_ptr<float>(), *S0_p = S0.data_ptr<float>();
  float *y_p = y.data_ptr<float>(), *last_p = last.data_ptr<float>();
  const int64_t N = s.N, P = s.P, PN = P * N;
  at::parallel_for(0, s.batch * s.heads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / s.heads, h = bh % s.heads;
      float* S = last_p + bh * PN;  // the state lives in its output
      std::memcpy(S, S0_p + bh * PN, PN * sizeof(float));
      for (int64_t t = 0; t < s.steps; ++t) {
        const float dt_t = dt_p[s.dt_at(b, t, h)], a = std::exp(dt_t * A_p[h]);
        const float *x_t = x_p + s.x_at(b, t, h), *B_t = B_p + s.bc_at(b, t, h), *C_t = C_p + s.bc_at(b, t, h);
        float* y_t = y_p + s.x_at(b, t, h);
        for (int64_t p = 0; p < P; ++p) {
          const float u = dt_t * x_t[p];
          float* row = S + p * N;
          float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
          for (int64_t n = 0; n < N; ++n) {
            const float v = a * row[n] + u * B_t[n];
            row[n] = v;
            acc += v * C_t[n];
          }
          y_t[p] = acc;
        }
      }
    }
  });
  return {y, last};
}

// the forward's inputs, dy [B, T, H, P] and dlast [B, H, P, N]
// -> dx [B, T, H, P], ddt [B, T, H], dA [H], dB, dC per head [B, T, H, N], dS0 [B, H, P, N]
std::vector<at::Tensor> ssd_backward(at::Tensor x, at::Tensor dt, at::Tensor A, at::Tensor Bm, at::Tensor Cm,
                                     at::Tensor S0, at::Tensor dy, at::Tensor dlast, int64_t span) {
  const Ssd s = sizes(x, dt, A, Bm, Cm, S0);
  check(dy, "dy", 4); check(dlast, "dlast", 4);
  // at T = 0 one empty span, so the buffers below hold a state
  const int64_t N = s.N, P = s.P, PN = P * N, spans = std::max<int64_t>(1, (s.steps + span - 1) / span);
  at::Tensor dx = at::empty_like(x), ddt = at::empty_like(dt), dS0 = at::empty_like(S0);
  at::Tensor dA_part = at::empty({s.batch, s.heads}, x.options());
  at::Tensor dB = at::empty({s.batch, s.steps, s.heads, N}, x.options()), dC = at::empty_like(dB);
  const float *x_p = x.data_ptr<float>(), *dt_p = dt.data_ptr<float>(), *A_p = A.data_ptr<float>();
  const float *B_p = Bm.data_ptr<float>(), *C_p = Cm.data_ptr<float>(), *S0_p = S0.data_ptr<float>();
  const float *dy_p = dy.data_ptr<float>(), *dlast_p = dlast.data_ptr<float>();
  float *dx_p = dx.data_ptr<float>(), *ddt_p = ddt.data_ptr<float>(), *dS0_p = dS0.data_ptr<float>();
  float *dA_p = dA_part.data_ptr<float>(), *dB_p = dB.data_ptr<float>(), *dC_p = dC.data_ptr<float>();
  at::parallel_for(0, s.batch * s.heads, 1, [&](int64_t begin, int64_t end) {
    // starts[j]: the state before span j; states[k]: the state before step k of the span in hand
    std::vector<float> starts(spans * PN), states(span * PN), carry(PN);
    float *dS = carry.data();
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / s.heads, h = bh % s.heads;
      const float A_h = A_p[h];
      std::memcpy(starts.data(), S0_p + bh * PN, PN * sizeof(float));
      for (int64_t j = 1; j < spans; ++j) {
        std::memcpy(starts.data() + j * PN, starts.data() + (j - 1) * PN, PN * sizeof(float));
        advance(s, starts.data() + j * PN, x_p, dt_p, A_h, B_p, b, h, (j - 1) * span, j * span);
      }
      std::memcpy(dS, dlast_p + bh * PN, PN * sizeof(float));
      float dA = 0.0f;
      for (int64_t j = spans - 1; j >= 0; --j) {
        const int64_t t0 = j * span, t1 = std::min(s.steps, t0 + span);
        // run[k]: the state before step t0 + k, recomputed from the span's start; the walk back
        // forms the state after a step from the one before it, so only those are kept
        float* run = states.data();
        std::memcpy(run, starts.data() + j * PN, PN * sizeof(float));
        for (int64_t t = t0; t + 1 < t1; ++t) {
          const float dt_t = dt_p[s.dt_at(b, t, h)], a = std::exp(dt_t * A_h);
          const float *x_t = x_p + s.x_at(b, t, h), *B_t = B_p + s.bc_at(b, t, h), *from = run + (t - t0) * PN;
          float* to = run + (t - t0 + 1) * PN;
          for (int64_t p = 0; p < P; ++p) {
            const float u = dt_t * x_t[p];
#pragma omp simd
            for (int64_t n = 0; n < N; ++n) to[p * N + n] = a * from[p * N + n] + u * B_t[n];
          }
        }
        for (int64_t t = t1 - 1; t >= t0; --t) {
          const float dt_t = dt_p[s.dt_at(b, t, h)], a = std::exp(dt_t * A_h);
          const float *x_t = x_p + s.x_at(b, t, h), *dy_t = dy_p + s.x_at(b, t, h);
          const float *B_t = B_p + s.bc_at(b, t, h), *C_t = C_p + s.bc_at(b, t, h);
          const float* S_prev = run + (t - t0) * PN;
          float *dB_t = dB_p + s.head_at(b, t, h), *dC_t = dC_p + s.head_at(b, t, h);
          float* dx_t = dx_p + s.x_at(b, t, h);
          std::memset(dB_t, 0, N * sizeof(float));
          std::memset(dC_t, 0, N * sizeof(float));
          float decay = 0.0f, through_u = 0.0f;
          for (int64_t p = 0; p < P; ++p) {
            const float gy = dy_t[p], u = dt_t * x_t[p];
            float* g_row = dS + p * N;
            const float* prev_row = S_prev + p * N;
            float du = 0.0f, dec = 0.0f;
#pragma omp simd reduction(+ : du, dec)
            for (int64_t n = 0; n < N; ++n) {
              const float prev = prev_row[n], g = g_row[n] + gy * C_t[n];  // dL/dS_t
              dC_t[n] += gy * (a * prev + u * B_t[n]);                      // S_t, formed again
              du += g * B_t[n];
              dB_t[n] += g * u;
              dec += g * prev;
              g_row[n] = a * g;                                             // dL/dS_{t-1} through S_t
            }
            dx_t[p] = dt_t * du;
            through_u += du * x_t[p];
            decay += dec;
          }
          ddt_p[s.dt_at(b, t, h)] = through_u + decay * a * A_h;
          dA += decay * a * dt_t;
        }
      }
      std::memcpy(dS0_p + bh * PN, dS, PN * sizeof(float));
      dA_p[bh] = dA;
    }
  });
  return {dx, ddt, dA_part.sum(0), dB, dC, dS0};
}
"""


def _self_check(module) -> str | None:
    """Run the build on small odd shapes against the reference; None if forward and gradients agree."""
    from .naive import ssd_naive

    gen = torch.Generator().manual_seed(0)
    b, t, h, g, p, n = 2, SPAN + 3, 4, 2, 5, 3
    inputs = dict(x=torch.randn(b, t, h, p, generator=gen), dt=torch.rand(b, t, h, generator=gen) + 0.1,
                  A=-torch.rand(h, generator=gen) * 2, B=torch.randn(b, t, g, n, generator=gen),
                  C=torch.randn(b, t, g, n, generator=gen), D=torch.randn(h, generator=gen),
                  initial_state=torch.randn(b, h, p, n, generator=gen))
    return compare_scans(ssd_naive, lambda **kw: _ssd(module, **kw), inputs, output="y")


SSD = Extension("ssd")
SSD.add("ssd", SOURCE, ["ssd_forward", "ssd_backward"], _self_check, fallback="the chunked PyTorch form")


def load():
    """The compiled module, building and checking it on first call; None if it cannot be used here."""
    return SSD.module("ssd")


def available() -> bool:
    """Whether the C++ kernel compiled here and agrees with the reference (builds it on first call)."""
    return SSD.available("ssd")


def build_error() -> str | None:
    """Why the kernel is not used, after `load`; None when it is (or before the first try)."""
    return SSD.build_error("ssd")


class _Ssd(torch.autograd.Function):
    """The recurrence: (x, dt, A, B, C, S0) -> (S_t C_t [B, T, H, P], S_T [B, H, P, N])."""

    @staticmethod
    def forward(ctx, module, x, dt, A, B_BTGN, C_BTGN, S0):
        y, last = module.ssd_forward(x, dt, A, B_BTGN, C_BTGN, S0)
        ctx.module = module
        ctx.save_for_backward(x, dt, A, B_BTGN, C_BTGN, S0)
        return y, last

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, dlast):
        x, dt, A, B_BTGN, C_BTGN, S0 = ctx.saved_tensors
        dx, ddt, dA, dB_BTHN, dC_BTHN, dS0 = ctx.module.ssd_backward(
            x, dt, A, B_BTGN, C_BTGN, S0, dy.contiguous(), dlast.contiguous(), SPAN)
        batch, steps, groups, state = B_BTGN.shape
        # a group's heads share its B and C: their gradients add up, [B, T, H, N] -> [B, T, G, N]
        per_group = x.shape[2] // groups
        dB, dC = (d.view(batch, steps, groups, per_group, state).sum(3) for d in (dB_BTHN, dC_BTHN))
        return None, dx, ddt, dA, dB, dC, dS0


def _ssd(module, x, dt, A, B, C, D=None, *, initial_state=None, return_last_state=False):
    out_dtype = x.dtype
    x_BTHP = x.float().contiguous()
    batch, _, heads, head_dim = x_BTHP.shape
    if heads % B.shape[2]:
        raise ValueError(f"ssd: {heads} heads do not split evenly over {B.shape[2]} groups")
    if initial_state is None:
        S0_BHPN = x_BTHP.new_zeros(batch, heads, head_dim, B.shape[-1])
    else:
        S0_BHPN = initial_state.float().contiguous()
    y_BTHP, last_BHPN = _Ssd.apply(module, x_BTHP, dt.float().contiguous(), A.float().contiguous(),
                                   B.float().contiguous(), C.float().contiguous(), S0_BHPN)
    if D is not None:
        y_BTHP = y_BTHP + x_BTHP * D.float()[:, None]
    y_BTHP = y_BTHP.to(out_dtype)
    return (y_BTHP, last_BHPN) if return_last_state else y_BTHP


def ssd_cpu(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    *,
    initial_state: torch.Tensor | None = None,
    return_last_state: bool = False,
    chunk_size: int | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """SSD through the compiled CPU loop; matches `ssd_naive`.

    Args:
        x: [B, T, H, P] input.
        dt: [B, T, H] step size (positive).
        A: [H] per-head decay rate (negative for a decaying state).
        B: [B, T, G, N] input matrix.
        C: [B, T, G, N] output matrix.
        D: [H] skip weight, or None for no skip.
        initial_state: [B, H, P, N] state before the first step; zeros if None.
        return_last_state: also return the state after the last step.
        chunk_size: accepted for the chunked form's signature and unused: the loop has no chunks.

    Returns:
        y [B, T, H, P] in x's dtype, or (y, last_state) with last_state [B, H, P, N] in fp32.

    Raises:
        RuntimeError: the kernel did not build or failed its check here (`build_error` says why);
            dispatch checks `available` first and takes the PyTorch path instead.
    """
    return _ssd(SSD.require("ssd"), x, dt, A, B, C, D, initial_state=initial_state,
                return_last_state=return_last_state)
