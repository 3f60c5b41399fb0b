"""Mamba-1 selective scan, C++ CPU kernel: the loop of naive.py compiled, the state in cache.

Same signature and return as `selective_scan_naive`; see tests/kernels/test_selective_scan.py.
Dimensions: B batch, E channels, N state size, T time.

Why a compiled loop. On a CPU the chunked PyTorch form (chunked.py) is bound by memory: it
builds several [B, T, E, N] fp32 tensors and passes over them a few times, while the recurrence
itself needs only B*T*E*N multiply-adds reading [B, T, E] and [B, T, N] inputs. This kernel walks
t = 0..T-1 for one (batch, channel) at a time with the [N] state in registers, so it reads and
writes only the inputs and outputs; the (batch, channel) pairs are spread over torch's threads
(at::parallel_for) and the loop over N is vectorised, with exp written as a polynomial the
compiler can vectorise (Cephes' expf: 2^k times a degree-6 polynomial, relative error ~2e-7).

A skipped token (a looped model's exited one) arrives with delta = 0: exp(0) is exactly 1 here
too and it writes nothing, so the state passes through unchanged, with no special case.

Backward, per (batch, channel): the forward is rerun into a [T + 1, N] scratch of states and a
[T, N] one of the decays a_t (32 KiB each at T = 512, N = 16, so they stay in cache), then walked
backward carrying dh, reading each a_t rather than taking its exp again (0.83x the backward's
time at B 8, E 224, T 256, N 16):

    h_t = a_t h_{t-1} + delta_t u_t B_t,   a_t = exp(delta_t A),   y_t = <h_t, C_t>
    dh_t += dy_t C_t;   dC_t += dy_t h_t;   dB_t += dh_t delta_t u_t
    d delta_t = sum_n dh_t h_{t-1} a_t A + u_t sum_n dh_t B_t;   du_t = delta_t sum_n dh_t B_t
    dA += dh_t h_{t-1} a_t delta_t;   dh_{t-1} = a_t dh_t

B and C are shared by all channels, so their gradients are sums over E: each block of channels
writes its own partial sum and torch adds the blocks (dA likewise over the batch), which keeps
the result independent of how the work was scheduled.

Delta's bias and softplus, the skip D u and the gate silu(z) are [B, E, T] elementwise work and
stay in PyTorch around the kernel, differentiated by autograd.

Building: `SCAN` (archsearch_kernels/cpu_build.py) compiles the source below on first use (about a minute),
once per machine, and checks it against the reference on small odd shapes. If it does not
compile or does not agree, `available()` is False, the reason is in `build_error()`, and
dispatch falls back to the chunked PyTorch form (archsearch_kernels/dispatch.py).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from ..cpu_build import Extension, compare_scans

# channels per block of the backward's partial dB, dC sums: few blocks keep the final sum small
BLOCK_E = 32

SOURCE = r"""
namespace {

using archsearch_cpu::exp_lane;

// the forward of one (batch, channel) from hs[0] = h0, keeping every state, hs[t + 1] = h_t, and
// every decay, as[t] = exp(delta_t A), which the walk back reads instead of computing it again
void rerun(float* hs, float* as, const float* u, int64_t su, const float* delta, int64_t sd, const float* A,
           const float* Bm, int64_t sBt, int64_t steps, int64_t N) {
  for (int64_t t = 0; t < steps; ++t) {
    const float dt = delta[t * sd], dtu = dt * u[t * su];
    const float* B_t = Bm + t * sBt;
    const float* prev = hs + t * N;
    float *next = hs + (t + 1) * N, *a_t = as + t * N;
#pragma omp simd
    for (int64_t n = 0; n < N; ++n) {
      const float a = exp_lane(dt * A[n]);
      a_t[n] = a;
      next[n] = a * prev[n] + dtu * B_t[n];
    }
  }
}

struct Strides {  // element strides of a [B, E, T] tensor
  int64_t b, e, t;
  explicit Strides(const at::Tensor& x) : b(x.stride(0)), e(x.stride(1)), t(x.stride(2)) {}
  int64_t at(int64_t bi, int64_t ei) const { return bi * b + ei * e; }
};

void check(const at::Tensor& x, const char* name, int64_t dim) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.device().is_cpu() && x.dim() == dim,
              name, ": expected a float32 CPU tensor of ", dim, " dims");
}

void check_inputs(const at::Tensor& u, const at::Tensor& delta, const at::Tensor& A,
                  const at::Tensor& Bm, const at::Tensor& Cm, const at::Tensor& h0) {
  check(u, "u", 3); check(delta, "delta", 3); check(A, "A", 2); check(Bm, "B", 3);
  check(Cm, "C", 3); check(h0, "initial_state", 3);
  TORCH_CHECK(A.is_contiguous() && h0.is_contiguous(), "A and initial_state must be contiguous");
  TORCH_CHECK(Bm.stride(2) == 1 && Cm.stride(2) == 1, "B and C ([B, T, N]) must be contiguous in N");
  TORCH_CHECK(delta.sizes() == u.sizes(), "delta must have u's shape [B, E, T]");
}

}  // namespace

// u, delta [B, E, T] (any strides); A [E, N]; Bm, Cm [B, T, N] (unit stride in N); h0 [B, E, N]
// -> y [B, E, T] (u's layout): <h_t, C_t>, and the last state [B, E, N]
std::vector<at::Tensor> scan_forward(at::Tensor u, at::Tensor delta, at::Tensor A, at::Tensor Bm,
                                     at::Tensor Cm, at::Tensor h0) {
  check_inputs(u, delta, A, Bm, Cm, h0);
  const int64_t batch = u.size(0), channels = u.size(1), steps = u.size(2), N = A.size(1);
  at::Tensor y = at::empty_like(u);
  at::Tensor last = at::empty({batch, channels, N}, u.options());
  const Strides su(u), sd(delta), sy(y);
  const int64_t sBb = Bm.stride(0), sBt = Bm.stride(1), sCb = Cm.stride(0), sCt = Cm.stride(1);
  const float *u_p = u.data_ptr<float>(), *d_p = delta.data_ptr<float>(), *A_p = A.data_ptr<float>();
  const float *B_p = Bm.data_ptr<float>(), *C_p = Cm.data_ptr<float>(), *h0_p = h0.data_ptr<float>();
  float *y_p = y.data_ptr<float>(), *last_p = last.data_ptr<float>();
  at::parallel_for(0, batch * channels, 4, [&](int64_t begin, int64_t end) {
    std::vector<float> state(N);
    float* h = state.data();
    for (int64_t be = begin; be < end; ++be) {
      const int64_t b = be / channels, e = be % channels;
      const float* A_e = A_p + e * N;
      std::memcpy(h, h0_p + be * N, N * sizeof(float));
      const float *u_be = u_p + su.at(b, e), *d_be = d_p + sd.at(b, e);
      float* y_be = y_p + sy.at(b, e);
      for (int64_t t = 0; t < steps; ++t) {
        const float dt = d_be[t * sd.t], dtu = dt * u_be[t * su.t];
        const float *B_t = B_p + b * sBb + t * sBt, *C_t = C_p + b * sCb + t * sCt;
        float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
        for (int64_t n = 0; n < N; ++n) {
          const float hn = exp_lane(dt * A_e[n]) * h[n] + dtu * B_t[n];
          h[n] = hn;
          acc += hn * C_t[n];
        }
        y_be[t * sy.t] = acc;
      }
      std::memcpy(last_p + be * N, h, N * sizeof(float));
    }
  });
  return {y, last};
}

// the forward's inputs, dy [B, E, T] and dlast [B, E, N]
// -> du, ddelta [B, E, T], dA [E, N], dB, dC [B, T, N] (contiguous), dh0 [B, E, N]
std::vector<at::Tensor> scan_backward(at::Tensor u, at::Tensor delta, at::Tensor A, at::Tensor Bm,
                                      at::Tensor Cm, at::Tensor h0, at::Tensor dy, at::Tensor dlast,
                                      int64_t block_e) {
  check_inputs(u, delta, A, Bm, Cm, h0);
  check(dy, "dy", 3); check(dlast, "dlast", 3);
  TORCH_CHECK(dlast.is_contiguous(), "dlast must be contiguous");
  const int64_t batch = u.size(0), channels = u.size(1), steps = u.size(2), N = A.size(1);
  const int64_t blocks = (channels + block_e - 1) / block_e;
  at::Tensor du = at::empty_like(u), ddelta = at::empty_like(delta);
  at::Tensor dh0 = at::empty({batch, channels, N}, u.options());
  at::Tensor dA_part = at::empty({batch, channels, N}, u.options());
  at::Tensor dB_part = at::zeros({batch, blocks, steps, N}, u.options());
  at::Tensor dC_part = at::zeros({batch, blocks, steps, N}, u.options());
  const Strides su(u), sd(delta), sg(dy), sdu(du), sdd(ddelta);
  const int64_t sBb = Bm.stride(0), sBt = Bm.stride(1), sCb = Cm.stride(0), sCt = Cm.stride(1);
  const float *u_p = u.data_ptr<float>(), *d_p = delta.data_ptr<float>(), *A_p = A.data_ptr<float>();
  const float *B_p = Bm.data_ptr<float>(), *C_p = Cm.data_ptr<float>(), *h0_p = h0.data_ptr<float>();
  const float *dy_p = dy.data_ptr<float>(), *dlast_p = dlast.data_ptr<float>();
  float *du_p = du.data_ptr<float>(), *dd_p = ddelta.data_ptr<float>(), *dh0_p = dh0.data_ptr<float>();
  float *dA_p = dA_part.data_ptr<float>(), *dBp = dB_part.data_ptr<float>(), *dCp = dC_part.data_ptr<float>();
  at::parallel_for(0, batch * blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch((steps + 1) * N), decays(steps * N), carry(N), grad_A(N);
    float *hs = scratch.data(), *as = decays.data(), *g = carry.data(), *gA = grad_A.data();
    for (int64_t bk = begin; bk < end; ++bk) {
      const int64_t b = bk / blocks, block = bk % blocks;
      float *dB_blk = dBp + bk * steps * N, *dC_blk = dCp + bk * steps * N;
      const int64_t e_end = std::min(channels, (block + 1) * block_e);
      for (int64_t e = block * block_e; e < e_end; ++e) {
        const int64_t be = b * channels + e;
        const float* A_e = A_p + e * N;
        const float *u_be = u_p + su.at(b, e), *d_be = d_p + sd.at(b, e), *dy_be = dy_p + sg.at(b, e);
        float *du_be = du_p + sdu.at(b, e), *dd_be = dd_p + sdd.at(b, e);
        // rerun the forward, keeping every state: hs[t + 1] = h_t, hs[0] = h0
        std::memcpy(hs, h0_p + be * N, N * sizeof(float));
        rerun(hs, as, u_be, su.t, d_be, sd.t, A_e, B_p + b * sBb, sBt, steps, N);
        std::memcpy(g, dlast_p + be * N, N * sizeof(float));
        std::memset(gA, 0, N * sizeof(float));
        for (int64_t t = steps - 1; t >= 0; --t) {
          const float dt = d_be[t * sd.t], ut = u_be[t * su.t], gy = dy_be[t * sg.t];
          const float *B_t = B_p + b * sBb + t * sBt, *C_t = C_p + b * sCb + t * sCt;
          const float *h_t = hs + (t + 1) * N, *prev = hs + t * N, *a_t = as + t * N;
          float *dB_t = dB_blk + t * N, *dC_t = dC_blk + t * N;
          float decay_part = 0.0f, input_part = 0.0f;
#pragma omp simd reduction(+ : decay_part, input_part)
          for (int64_t n = 0; n < N; ++n) {
            const float a = a_t[n];
            const float gn = g[n] + gy * C_t[n];         // dL/dh_t
            dC_t[n] += gy * h_t[n];
            const float da = gn * prev[n] * a;          // dL/d(delta_t A) through a_t
            decay_part += da * A_e[n];
            gA[n] += da * dt;
            input_part += gn * B_t[n];
            dB_t[n] += gn * dt * ut;
            g[n] = gn * a;                              // dL/dh_{t-1} through h_t
          }
          dd_be[t * sdd.t] = decay_part + ut * input_part;
          du_be[t * sdu.t] = dt * input_part;
        }
        std::memcpy(dh0_p + be * N, g, N * sizeof(float));
        std::memcpy(dA_p + be * N, gA, N * sizeof(float));
      }
    }
  });
  return {du, ddelta, dA_part.sum(0), dB_part.sum(1), dC_part.sum(1), dh0};
}
"""

# the vector extensions each capability torch reports may use (torch.backends.cpu.get_cpu_capability)
def _self_check(module) -> str | None:
    """Run the build on small odd shapes against the reference; None if forward and gradients agree."""
    from .naive import selective_scan_naive

    gen = torch.Generator().manual_seed(0)
    b, e, n, t = 2, BLOCK_E + 3, 5, 19
    inputs = dict(u=torch.randn(b, e, t, generator=gen), delta=torch.randn(b, e, t, generator=gen),
                  A=-torch.rand(e, n, generator=gen) * 4, B=torch.randn(b, n, t, generator=gen),
                  C=torch.randn(b, n, t, generator=gen), initial_state=torch.randn(b, e, n, generator=gen))
    return compare_scans(selective_scan_naive, functools.partial(_scan, module), inputs, output="y",
                         delta_softplus=True)


SCAN = Extension("selective_scan")
SCAN.add("selective_scan", SOURCE, ["scan_forward", "scan_backward"], _self_check,
         fallback="the chunked PyTorch form")


def load():
    """The compiled module, building and checking it on first call; None if it cannot be used here."""
    return SCAN.module("selective_scan")


def available() -> bool:
    """Whether the C++ kernel compiled here and agrees with the reference (builds it on first call)."""
    return SCAN.available("selective_scan")


def build_error() -> str | None:
    """Why the kernel is not used, after `load`; None when it is (or before the first try)."""
    return SCAN.build_error("selective_scan")


class _Scan(torch.autograd.Function):
    """The core recurrence: (u, delta, A, B [B, T, N], C [B, T, N], h0) -> (<h_t, C_t> [B, E, T], h_T)."""

    @staticmethod
    def forward(ctx, module, u, delta, A, B_BTN, C_BTN, h0):
        y, last = module.scan_forward(u, delta, A, B_BTN, C_BTN, h0)
        ctx.module = module
        ctx.save_for_backward(u, delta, A, B_BTN, C_BTN, h0)
        return y, last

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, dlast):
        u, delta, A, B_BTN, C_BTN, h0 = ctx.saved_tensors
        grads = ctx.module.scan_backward(u, delta, A, B_BTN, C_BTN, h0, dy, dlast.contiguous(), BLOCK_E)
        return None, *grads


def _scan(module, u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False, *,
          initial_state=None, return_last_state=False):
    out_dtype = u.dtype
    u_BET, delta_BET = u.float(), delta.float()
    if delta_bias is not None:
        delta_BET = delta_BET + delta_bias.float()[:, None]
    if delta_softplus:
        delta_BET = F.softplus(delta_BET)
    batch, channels, _ = u_BET.shape
    state_size = A.shape[1]
    if initial_state is None:
        h0_BEN = u_BET.new_zeros(batch, channels, state_size)
    else:
        h0_BEN = initial_state.float().contiguous()

    def time_major(x_BNT: torch.Tensor) -> torch.Tensor:
        """[B, N, T] -> a [B, T, N] view (a Mamba layer's B and C already lie that way), unit stride in N."""
        x_BTN = x_BNT.float().transpose(1, 2)
        return x_BTN if x_BTN.stride(2) == 1 else x_BTN.contiguous()

    y_BET, last_BEN = _Scan.apply(module, u_BET, delta_BET, A.float().contiguous(), time_major(B), time_major(C),
                                  h0_BEN)
    if D is not None:
        y_BET = y_BET + u_BET * D.float()[:, None]
    if z is not None:
        y_BET = y_BET * F.silu(z.float())
    y_BET = y_BET.to(out_dtype)
    return (y_BET, last_BEN) if return_last_state else y_BET


def selective_scan_cpu(
    u: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    delta_bias: torch.Tensor | None = None,
    delta_softplus: bool = False,
    *,
    initial_state: torch.Tensor | None = None,
    return_last_state: bool = False,
    chunk_size: int | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Selective scan through the compiled CPU loop; matches `selective_scan_naive`.

    Args:
        u: [B, E, T] input.
        delta: [B, E, T] step size before `delta_bias` and softplus (0 at a skipped token).
        A: [E, N] state matrix.
        B: [B, N, T] input matrix.
        C: [B, N, T] output matrix.
        D: [E] skip weight, or None.
        z: [B, E, T] gate, or None.
        delta_bias: [E] added to delta before the softplus, or None.
        delta_softplus: apply softplus to delta (after the bias).
        initial_state: [B, E, N] state before the first step; zeros if None.
        return_last_state: also return the state after the last step.
        chunk_size: accepted for the other forms' signature and unused: the loop has no chunks.

    Returns:
        y [B, E, T] in u's dtype, or (y, last_state) with last_state [B, E, N] in fp32.

    Raises:
        RuntimeError: the kernel did not build or failed its check here (`build_error` says why);
            dispatch checks `available` first and takes the PyTorch path instead.
    """
    return _scan(SCAN.require("selective_scan"), u, delta, A, B, C, D, z, delta_bias, delta_softplus,
                 initial_state=initial_state, return_last_state=return_last_state)
