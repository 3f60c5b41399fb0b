"""Mamba-1 selective scan, C++ CPU kernel: the loop of naive.py compiled, the state in cache.

Same signature and return as `selective_scan_naive`; see tests/kernels/test_selective_scan.py.
Dimensions: B batch, E channels, N state size, T time, L lanes (16).

Why a compiled loop. On a CPU the chunked PyTorch form (chunked.py) is bound by memory: it
builds several [B, T, E, N] fp32 tensors and passes over them a few times, while the recurrence
itself needs only B*T*E*N multiply-adds reading [B, T, E] and [B, T, N] inputs.

This kernel walks t = 0..T-1 for 16 channels of one batch row at a time, side by side, one
channel per vector lane: a Mamba layer's u and delta are [B, T, E] tensors (seen as [B, E, T]),
so the 16 channels' values at a step are adjacent in memory, and other layouts are copied into
that one first. The state is [N, L] (1 KiB at N = 16) in L1; every op of the recurrence is a
lane-wise multiply-add, so the readout <h_t, C_t> needs no sum across a vector's lanes, as it
did when one channel's N states filled the vector (that form took 2.6x this one's forward time
at B 8, E 224, T 256, N 16). exp is a polynomial the compiler vectorises (Cephes' expf: 2^k
times a degree-6 polynomial, relative error ~2e-7). The groups of channels are spread over
torch's threads (at::parallel_for).

A skipped token (a looped model's exited one) arrives with delta = 0: exp(0) is exactly 1 here
too and it writes nothing, so the state passes through unchanged, with no special case.

Backward, per group: the forward is rerun into a [T + 1, N, L] scratch of states and a
[T, N, L] one of the decays a_t (256 KiB each at T = 256, N = 16, in L2, each aligned to a cache
line), then walked backward carrying dh, reading each a_t rather than taking its exp again:

    h_t = a_t h_{t-1} + delta_t u_t B_t,   a_t = exp(delta_t A),   y_t = <h_t, C_t>
    dh_t += dy_t C_t;   dC_t += dy_t h_t;   dB_t += dh_t delta_t u_t
    d delta_t = sum_n dh_t h_{t-1} a_t A + u_t sum_n dh_t B_t;   du_t = delta_t sum_n dh_t B_t
    dA += dh_t h_{t-1} a_t delta_t;   dh_{t-1} = a_t dh_t

The sums over N are per-lane. B and C are shared by all channels, so dB and dC are sums over the
lanes: a step's N lane vectors of each are summed sixteen at a time by a transpose-and-add tree
(`row_sums`, AVX-512; one by one elsewhere). Each group writes its own partial dB, dC and torch
adds the groups (dA likewise over the batch), which keeps the result independent of how the work
was scheduled. Against the one-channel-at-a-time form, forward and backward take 0.56x the CPU
time at B 8, E 224, T 256, N 16, 0.44x at B 2, E 256, T 2048, and 0.96x at N 64, T 512 (one
thread, median of 9 interleaved calls, both built in one process).

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

# channels walked side by side, one per vector lane (the C++ `L`)
LANES = 16

SOURCE = r"""
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

using archsearch_cpu::exp_lane;

struct Strides {  // element strides of a [B, E, T] tensor
  int64_t b, e, t;
  explicit Strides(const at::Tensor& x) : b(x.stride(0)), e(x.stride(1)), t(x.stride(2)) {}
  int64_t at(int64_t bi, int64_t ei) const { return bi * b + ei * e; }
};

void check(const at::Tensor& x, const char* name, int64_t dim) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.device().is_cpu() && x.dim() == dim,
              name, ": expected a float32 CPU tensor of ", dim, " dims");
}

void check_channel_minor(const at::Tensor& x, const char* name) {
  check(x, name, 3);
  TORCH_CHECK(x.stride(1) == 1, name, ": expected unit stride in E ([B, T, E] memory, seen as [B, E, T])");
}

void check_inputs(const at::Tensor& u, const at::Tensor& delta, const at::Tensor& A,
                  const at::Tensor& Bm, const at::Tensor& Cm, const at::Tensor& h0) {
  check_channel_minor(u, "u"); check_channel_minor(delta, "delta"); check(A, "A", 2); check(Bm, "B", 3);
  check(Cm, "C", 3); check(h0, "initial_state", 3);
  TORCH_CHECK(A.is_contiguous() && h0.is_contiguous(), "A and initial_state must be contiguous");
  TORCH_CHECK(Bm.stride(2) == 1 && Cm.stride(2) == 1, "B and C ([B, T, N]) must be contiguous in N");
  TORCH_CHECK(delta.sizes() == u.sizes(), "delta must have u's shape [B, E, T]");
}


using archsearch_cpu::Lines;

constexpr int64_t L = 16;  // channels side by side, one per vector lane

// out[i] = sum_l rows[i L + l] for i < n: sixteen at a time by a transpose-and-add tree (AVX-512),
// the rest one by one
inline void row_sums(const float* rows, int64_t n, float* out) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) {
    const float* r = rows + i * L;
    __m512 pairs[8], quads[4];
    for (int j = 0; j < 8; ++j) {  // per 128-bit block: [a0+a2, b0+b2, a1+a3, b1+b3] of rows a, b
      const __m512 a = _mm512_loadu_ps(r + 2 * j * L), b = _mm512_loadu_ps(r + (2 * j + 1) * L);
      pairs[j] = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    }
    for (int j = 0; j < 4; ++j) {  // per 128-bit block: the block's sums of rows 4j .. 4j + 3
      const __m512 c = pairs[2 * j], d = pairs[2 * j + 1];
      quads[j] = _mm512_add_ps(_mm512_shuffle_ps(c, d, _MM_SHUFFLE(1, 0, 1, 0)),
                               _mm512_shuffle_ps(c, d, _MM_SHUFFLE(3, 2, 3, 2)));
    }
    // add the four 128-bit blocks of each quad: block j of the result holds rows 4j .. 4j + 3
    const __m512 x01 = _mm512_add_ps(_mm512_shuffle_f32x4(quads[0], quads[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                     _mm512_shuffle_f32x4(quads[0], quads[1], _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512 x23 = _mm512_add_ps(_mm512_shuffle_f32x4(quads[2], quads[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                     _mm512_shuffle_f32x4(quads[2], quads[3], _MM_SHUFFLE(3, 1, 3, 1)));
    _mm512_storeu_ps(out + i, _mm512_add_ps(_mm512_shuffle_f32x4(x01, x23, _MM_SHUFFLE(2, 0, 2, 0)),
                                            _mm512_shuffle_f32x4(x01, x23, _MM_SHUFFLE(3, 1, 3, 1))));
  }
#endif
  for (; i < n; ++i) {
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t l = 0; l < L; ++l) sum += rows[i * L + l];
    out[i] = sum;
  }
}

struct Group {  // channels e0 .. e0 + width - 1 of batch row b
  int64_t b, e0, width;
  // [N] rows of a [.., E, N] tensor's channels at `row` (b E + e0 for a [B, E, N] one) -> out[n L + l]
  void pack_state(const float* src, int64_t row, int64_t N, float* out) const {
    for (int64_t l = 0; l < L; ++l)
      for (int64_t n = 0; n < N; ++n) out[n * L + l] = l < width ? src[(row + l) * N + n] : 0.0f;
  }
  void unpack_state(const float* in, int64_t row, int64_t N, float* dst) const {
    for (int64_t l = 0; l < width; ++l)
      for (int64_t n = 0; n < N; ++n) dst[(row + l) * N + n] = in[n * L + l];
  }
  // step t's L values of a [B, E, T] tensor with unit stride in E (0 past the group's width)
  void load(const float* src, const Strides& s, int64_t t, float* out) const {
    const float* at = src + s.at(b, e0) + t * s.t;
#pragma omp simd
    for (int64_t l = 0; l < L; ++l) out[l] = l < width ? at[l] : 0.0f;
  }
  void store(const float* in, const Strides& s, int64_t t, float* dst) const {
    float* at = dst + s.at(b, e0) + t * s.t;
    for (int64_t l = 0; l < width; ++l) at[l] = in[l];
  }
};

int64_t groups(int64_t channels) { return (channels + L - 1) / L; }

void forward(const Strides& su, const Strides& sd, const Strides& sy, int64_t batch, int64_t channels,
             int64_t steps, int64_t N, const float* u_p, const float* d_p, const float* A_p, const float* B_p,
             int64_t sBb, int64_t sBt, const float* C_p, int64_t sCb, int64_t sCt, const float* h0_p, float* y_p,
             float* last_p) {
  const int64_t per_row = groups(channels);
  at::parallel_for(0, batch * per_row, 1, [&](int64_t begin, int64_t end) {
    Lines state(N * L), decay_rates(N * L);
    float *h = state.data(), *At = decay_rates.data();
    for (int64_t bg = begin; bg < end; ++bg) {
      const int64_t e0 = (bg % per_row) * L;
      const Group grp{bg / per_row, e0, std::min(L, channels - e0)};
      grp.pack_state(A_p, e0, N, At);
      grp.pack_state(h0_p, grp.b * channels + e0, N, h);
      for (int64_t t = 0; t < steps; ++t) {
        alignas(64) float dt[L], dtu[L], acc[L] = {};
        grp.load(d_p, sd, t, dt);
        grp.load(u_p, su, t, dtu);
#pragma omp simd
        for (int64_t l = 0; l < L; ++l) dtu[l] *= dt[l];
        const float *B_t = B_p + grp.b * sBb + t * sBt, *C_t = C_p + grp.b * sCb + t * sCt;
        for (int64_t n = 0; n < N; ++n) {
          const float Bn = B_t[n], Cn = C_t[n], *An = At + n * L;
          float* hn = h + n * L;
#pragma omp simd
          for (int64_t l = 0; l < L; ++l) {
            const float v = exp_lane(dt[l] * An[l]) * hn[l] + dtu[l] * Bn;
            hn[l] = v;
            acc[l] += v * Cn;
          }
        }
        grp.store(acc, sy, t, y_p);
      }
      grp.unpack_state(h, grp.b * channels + e0, N, last_p);
    }
  });
}

// dB, dC: one partial sum per group of L channels, [B, groups, T, N]; dA per channel [B, E, N]
void backward(const Strides& su, const Strides& sd, const Strides& sg, const Strides& sdu, const Strides& sdd,
              int64_t batch, int64_t channels, int64_t steps, int64_t N, const float* u_p, const float* d_p,
              const float* A_p, const float* B_p, int64_t sBb, int64_t sBt, const float* C_p, int64_t sCb,
              int64_t sCt, const float* h0_p, const float* dy_p, const float* dlast_p, float* du_p, float* dd_p,
              float* dh0_p, float* dA_p, float* dBp, float* dCp) {
  const int64_t per_row = groups(channels);
  at::parallel_for(0, batch * per_row, 1, [&](int64_t begin, int64_t end) {
    // hs[t + 1]: the state after step t (hs[0] = h0), as[t]: step t's decays, both [N][L]
    Lines states((steps + 1) * N * L), decays(steps * N * L), decay_rates(N * L), carry(N * L), grad_A(N * L);
    Lines terms_C(N * L), terms_B(N * L);
    float *hs = states.data(), *as = decays.data(), *At = decay_rates.data(), *g = carry.data(), *gA = grad_A.data();
    float *to_C = terms_C.data(), *to_B = terms_B.data();
    for (int64_t bg = begin; bg < end; ++bg) {
      const int64_t e0 = (bg % per_row) * L;
      const Group grp{bg / per_row, e0, std::min(L, channels - e0)};
      grp.pack_state(A_p, e0, N, At);
      grp.pack_state(h0_p, grp.b * channels + e0, N, hs);
      for (int64_t t = 0; t < steps; ++t) {  // the forward again, keeping every state and decay
        alignas(64) float dt[L], dtu[L];
        grp.load(d_p, sd, t, dt);
        grp.load(u_p, su, t, dtu);
        const float* B_t = B_p + grp.b * sBb + t * sBt;
        for (int64_t n = 0; n < N; ++n) {
          const float Bn = B_t[n], *An = At + n * L, *prev = hs + (t * N + n) * L;
          float *next = hs + ((t + 1) * N + n) * L, *a_t = as + (t * N + n) * L;
#pragma omp simd
          for (int64_t l = 0; l < L; ++l) {
            const float a = exp_lane(dt[l] * An[l]);
            a_t[l] = a;
            next[l] = a * prev[l] + dt[l] * dtu[l] * Bn;
          }
        }
      }
      grp.pack_state(dlast_p, grp.b * channels + e0, N, g);
      std::fill(gA, gA + N * L, 0.0f);
      float *dB_grp = dBp + bg * steps * N, *dC_grp = dCp + bg * steps * N;
      for (int64_t t = steps - 1; t >= 0; --t) {
        alignas(64) float dt[L], ut[L], gy[L], decay_part[L] = {}, input_part[L] = {};
        grp.load(d_p, sd, t, dt);
        grp.load(u_p, su, t, ut);
        grp.load(dy_p, sg, t, gy);
        const float *B_t = B_p + grp.b * sBb + t * sBt, *C_t = C_p + grp.b * sCb + t * sCt;
        for (int64_t n = 0; n < N; ++n) {
          const float Bn = B_t[n], Cn = C_t[n], *An = At + n * L;
          const float *h_t = hs + ((t + 1) * N + n) * L, *prev = hs + (t * N + n) * L, *a_t = as + (t * N + n) * L;
          float *gn_p = g + n * L, *gA_n = gA + n * L, *toC = to_C + n * L, *toB = to_B + n * L;
#pragma omp simd
          for (int64_t l = 0; l < L; ++l) {
            const float a = a_t[l], gn = gn_p[l] + gy[l] * Cn;  // dL/dh_t
            toC[l] = gy[l] * h_t[l];
            const float da = gn * prev[l] * a;                 // dL/d(delta_t A) through a_t
            decay_part[l] += da * An[l];
            gA_n[l] += da * dt[l];
            input_part[l] += gn * Bn;
            toB[l] = gn * dt[l] * ut[l];
            gn_p[l] = gn * a;                                  // dL/dh_{t-1} through h_t
          }
        }
        row_sums(to_C, N, dC_grp + t * N);
        row_sums(to_B, N, dB_grp + t * N);
        alignas(64) float dd[L], du[L];
#pragma omp simd
        for (int64_t l = 0; l < L; ++l) {
          dd[l] = decay_part[l] + ut[l] * input_part[l];
          du[l] = dt[l] * input_part[l];
        }
        grp.store(dd, sdd, t, dd_p);
        grp.store(du, sdu, t, du_p);
      }
      grp.unpack_state(g, grp.b * channels + e0, N, dh0_p);
      grp.unpack_state(gA, grp.b * channels + e0, N, dA_p);
    }
  });
}

}  // namespace

// u, delta [B, E, T] with unit stride in E; A [E, N]; Bm, Cm [B, T, N] (unit stride in N); h0 [B, E, N]
// -> y [B, E, T] (u's layout): <h_t, C_t>, and the last state [B, E, N]
std::vector<at::Tensor> scan_forward(at::Tensor u, at::Tensor delta, at::Tensor A, at::Tensor Bm,
                                     at::Tensor Cm, at::Tensor h0) {
  check_inputs(u, delta, A, Bm, Cm, h0);
  const int64_t batch = u.size(0), channels = u.size(1), steps = u.size(2), N = A.size(1);
  at::Tensor y = at::empty_like(u);
  at::Tensor last = at::empty({batch, channels, N}, u.options());
  forward(Strides(u), Strides(delta), Strides(y), batch, channels, steps, N, u.data_ptr<float>(),
          delta.data_ptr<float>(), A.data_ptr<float>(), Bm.data_ptr<float>(), Bm.stride(0), Bm.stride(1),
          Cm.data_ptr<float>(), Cm.stride(0), Cm.stride(1), h0.data_ptr<float>(), y.data_ptr<float>(),
          last.data_ptr<float>());
  return {y, last};
}

// the forward's inputs, dy [B, E, T] (unit stride in E) and dlast [B, E, N]
// -> du, ddelta [B, E, T], dA [E, N], dB, dC [B, T, N] (contiguous), dh0 [B, E, N]
std::vector<at::Tensor> scan_backward(at::Tensor u, at::Tensor delta, at::Tensor A, at::Tensor Bm,
                                      at::Tensor Cm, at::Tensor h0, at::Tensor dy, at::Tensor dlast) {
  check_inputs(u, delta, A, Bm, Cm, h0);
  check_channel_minor(dy, "dy"); check(dlast, "dlast", 3);
  TORCH_CHECK(dlast.is_contiguous(), "dlast must be contiguous");
  const int64_t batch = u.size(0), channels = u.size(1), steps = u.size(2), N = A.size(1);
  at::Tensor du = at::empty_like(u), ddelta = at::empty_like(delta);
  at::Tensor dh0 = at::empty({batch, channels, N}, u.options());
  at::Tensor dA_part = at::empty({batch, channels, N}, u.options());
  at::Tensor dB_part = at::empty({batch, groups(channels), steps, N}, u.options());
  at::Tensor dC_part = at::empty_like(dB_part);
  backward(Strides(u), Strides(delta), Strides(dy), Strides(du), Strides(ddelta), batch, channels, steps, N,
           u.data_ptr<float>(), delta.data_ptr<float>(), A.data_ptr<float>(), Bm.data_ptr<float>(), Bm.stride(0),
           Bm.stride(1), Cm.data_ptr<float>(), Cm.stride(0), Cm.stride(1), h0.data_ptr<float>(), dy.data_ptr<float>(),
           dlast.data_ptr<float>(), du.data_ptr<float>(), ddelta.data_ptr<float>(), dh0.data_ptr<float>(),
           dA_part.data_ptr<float>(), dB_part.data_ptr<float>(), dC_part.data_ptr<float>());
  return {du, ddelta, dA_part.sum(0), dB_part.sum(1), dC_part.sum(1), dh0};
}
"""

# the vector extensions each capability torch reports may use (torch.backends.cpu.get_cpu_capability)
def _self_check(module) -> str | None:
    """Run the build on small odd shapes against the reference; None if forward and gradients agree."""
    from .naive import selective_scan_naive

    gen = torch.Generator().manual_seed(0)
    b, e, n, t = 2, 2 * LANES + 3, 5, 19  # two groups of channels and a part of one
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


def channel_minor(x_BET: torch.Tensor) -> torch.Tensor:
    """x itself if its channels lie adjacent in memory (a Mamba layer's [B, T, E] tensors seen as
    [B, E, T]), else a copy laid out so."""
    return x_BET if x_BET.stride(1) == 1 else x_BET.transpose(1, 2).contiguous().transpose(1, 2)


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
        grads = ctx.module.scan_backward(u, delta, A, B_BTN, C_BTN, h0, channel_minor(dy), dlast.contiguous())
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

    y_BET, last_BEN = _Scan.apply(module, channel_minor(u_BET), channel_minor(delta_BET), A.float().contiguous(),
                                  time_major(B), time_major(C), h0_BEN)
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
