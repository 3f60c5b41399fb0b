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

One step's 16 values of u, delta and z lie a row of E floats after the last step's, a stride the
hardware prefetcher does not follow across pages, and a step's work (N exps and multiply-adds per
lane) is longer than the out-of-order window, so without help every load waits for memory. Each
step therefore asks for the lines `AHEAD` steps on (8; the outputs' lines too, for writing). That
took the forward to 0.64x and the backward to 0.70x of their times without it at B 8, E 224, T 256,
N 16 (2 threads), 0.63x overall at B 2, E 512, T 2048, and 0.92x at N 64, where a step's work is
longer (median of 25 interleaved calls of both builds in one process, AVX2).

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
(`row_sums`, AVX-512; one by one elsewhere). Each group writes its own
partial dB, dC and torch adds the groups (dA likewise over the batch), which keeps the result
independent of how the work was scheduled. Against the one-channel-at-a-time form, forward and
backward take 0.56x the CPU time at B 8, E 224, T 256, N 16, 0.44x at B 2, E 256, T 2048, and
0.96x at N 64, T 512 (one thread, median of 9 interleaved calls, both built in one process).

The skip D u and the gate silu(z) are taken at each step's readout, y_t = (<h_t, C_t> + D u_t)
silu(z_t), and differentiated in the walk back (the readouts <h_t, C_t> are kept from the rerun),
which saves the [B, E, T] elementwise passes around the kernel and autograd's for them. Delta's
bias and softplus run before it, in one pass of their own (softplus/cpu.py).

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
namespace {

using archsearch_cpu::exp_lane;
using archsearch_cpu::Lines;

// out[i] = the sum of the 16 floats at rows + 16 i, for i < n (n vectors of partial sums, one a row):
// sixteen rows at a time by a transpose-and-add tree (AVX-512), the rest one by one
inline void row_sums(const float* rows, int64_t n, float* out) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) {
    const float* r = rows + i * 16;
    __m512 pairs[8], quads[4];
    for (int j = 0; j < 8; ++j) {  // per 128-bit block: [a0+a2, b0+b2, a1+a3, b1+b3] of rows a, b
      const __m512 a = _mm512_loadu_ps(r + 2 * j * 16), b = _mm512_loadu_ps(r + (2 * j + 1) * 16);
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
    for (int64_t l = 0; l < 16; ++l) sum += rows[i * 16 + l];
    out[i] = sum;
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

void check_channel_minor(const at::Tensor& x, const char* name) {
  check(x, name, 3);
  TORCH_CHECK(x.stride(1) == 1, name, ": expected unit stride in E ([B, T, E] memory, seen as [B, E, T])");
}

constexpr int64_t L = 16;  // channels of one batch row walked side by side, one per vector lane

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
  // ask for step t's L values of a [B, E, T] tensor (read, or `write`) some steps before they are used:
  // one step's values lie E floats from the last's, a stride the hardware's prefetch does not follow
  // across pages, and a step's work is too long for the next step's loads to start under it
  void prefetch(const float* src, const Strides& s, int64_t t, bool write = false) const {
    const float* at = src + s.at(b, e0) + t * s.t;
    if (write) {
      __builtin_prefetch(at, 1);
      __builtin_prefetch(at + L - 1, 1);
    } else {
      __builtin_prefetch(at);
      __builtin_prefetch(at + L - 1);
    }
  }
  void store(const float* in, const Strides& s, int64_t t, float* dst) const {
    float* at = dst + s.at(b, e0) + t * s.t;
    for (int64_t l = 0; l < width; ++l) at[l] = in[l];
  }
};

int64_t groups(int64_t channels) { return (channels + L - 1) / L; }

constexpr int64_t AHEAD = 8;  // steps between a [B, E, T] tensor's prefetch and its load

inline float sigmoid_lane(float z) { return 1.0f / (1.0f + exp_lane(-z)); }

struct Inputs {  // the forward's tensors; D and z null when absent
  int64_t batch, channels, steps, N;
  Strides su, sd, sz;
  const float *u, *delta, *A, *B, *C, *h0, *D, *z;
  int64_t sBb, sBt, sCb, sCt;

  // u, delta, z [B, E, T] with unit stride in E; A [E, N]; Bm, Cm [B, T, N] (unit stride in N);
  // h0 [B, E, N]; D [E]; an empty D or z stands for none
  Inputs(const at::Tensor& u_, const at::Tensor& delta_, const at::Tensor& A_, const at::Tensor& Bm,
         const at::Tensor& Cm, const at::Tensor& h0_, const at::Tensor& D_, const at::Tensor& z_)
      : batch(u_.size(0)), channels(u_.size(1)), steps(u_.size(2)), N(A_.size(1)), su(u_), sd(delta_), sz(z_.numel() ? z_ : u_),
        u(u_.data_ptr<float>()), delta(delta_.data_ptr<float>()), A(A_.data_ptr<float>()), B(Bm.data_ptr<float>()),
        C(Cm.data_ptr<float>()), h0(h0_.data_ptr<float>()), D(D_.numel() ? D_.data_ptr<float>() : nullptr),
        z(z_.numel() ? z_.data_ptr<float>() : nullptr), sBb(Bm.stride(0)), sBt(Bm.stride(1)), sCb(Cm.stride(0)),
        sCt(Cm.stride(1)) {}
};

Inputs inputs(const at::Tensor& u, const at::Tensor& delta, const at::Tensor& A, const at::Tensor& Bm,
              const at::Tensor& Cm, const at::Tensor& h0, const at::Tensor& D, const at::Tensor& z) {
  check_channel_minor(u, "u"); check_channel_minor(delta, "delta"); check(A, "A", 2); check(Bm, "B", 3);
  check(Cm, "C", 3); check(h0, "initial_state", 3);
  TORCH_CHECK(A.is_contiguous() && h0.is_contiguous(), "A and initial_state must be contiguous");
  TORCH_CHECK(Bm.stride(2) == 1 && Cm.stride(2) == 1, "B and C ([B, T, N]) must be contiguous in N");
  TORCH_CHECK(delta.sizes() == u.sizes(), "delta must have u's shape [B, E, T]");
  if (D.numel()) {
    check(D, "D", 1);
    TORCH_CHECK(D.is_contiguous() && D.size(0) == u.size(1), "D must be a contiguous [E]");
  }
  if (z.numel()) {
    check_channel_minor(z, "z");
    TORCH_CHECK(z.sizes() == u.sizes(), "z must have u's shape [B, E, T]");
  }
  return Inputs(u, delta, A, Bm, Cm, h0, D, z);
}

// y = (<h_t, C_t> + D u_t) silu(z_t) in u's layout, and the last state
void forward(const Inputs& in, const Strides& sy, float* y_p, float* last_p) {
  const int64_t N = in.N, per_row = groups(in.channels);
  at::parallel_for(0, in.batch * per_row, 1, [&](int64_t begin, int64_t end) {
    Lines state(N * L), decay_rates(N * L);
    float *h = state.data(), *At = decay_rates.data();
    for (int64_t bg = begin; bg < end; ++bg) {
      const int64_t e0 = (bg % per_row) * L;
      const Group grp{bg / per_row, e0, std::min(L, in.channels - e0)};
      alignas(64) float Dl[L] = {};
      if (in.D) grp.pack_state(in.D, e0, 1, Dl);
      grp.pack_state(in.A, e0, N, At);
      grp.pack_state(in.h0, grp.b * in.channels + e0, N, h);
      for (int64_t t = 0; t < in.steps; ++t) {
        if (t + AHEAD < in.steps) {
          grp.prefetch(in.delta, in.sd, t + AHEAD);
          grp.prefetch(in.u, in.su, t + AHEAD);
          if (in.z) grp.prefetch(in.z, in.sz, t + AHEAD);
          grp.prefetch(y_p, sy, t + AHEAD, true);
        }
        alignas(64) float dt[L], ut[L], dtu[L], acc[L] = {};
        grp.load(in.delta, in.sd, t, dt);
        grp.load(in.u, in.su, t, ut);
#pragma omp simd
        for (int64_t l = 0; l < L; ++l) dtu[l] = dt[l] * ut[l];
        const float *B_t = in.B + grp.b * in.sBb + t * in.sBt, *C_t = in.C + grp.b * in.sCb + t * in.sCt;
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
#pragma omp simd
        for (int64_t l = 0; l < L; ++l) acc[l] += Dl[l] * ut[l];
        if (in.z) {
          alignas(64) float zt[L];
          grp.load(in.z, in.sz, t, zt);
#pragma omp simd
          for (int64_t l = 0; l < L; ++l) acc[l] *= zt[l] * sigmoid_lane(zt[l]);
        }
        grp.store(acc, sy, t, y_p);
      }
      grp.unpack_state(h, grp.b * in.channels + e0, N, last_p);
    }
  });
}

struct Grads {  // the backward's outputs: du, ddelta, dz like u; the rest per part, summed by torch
  Strides sdu, sdd, sdz;
  float *du, *ddelta, *dz, *dh0, *dA, *dD, *dB, *dC;  // dA [B, E, N], dD [B, E], dB, dC [B, groups, T, N]
};

// dy: the gradient of y (unit stride in E), dlast of the last state
void backward(const Inputs& in, const float* dy_p, const Strides& sg, const float* dlast_p, const Grads& out) {
  const int64_t N = in.N, steps = in.steps, per_row = groups(in.channels);
  at::parallel_for(0, in.batch * per_row, 1, [&](int64_t begin, int64_t end) {
    // hs[t + 1]: the state after step t (hs[0] = h0), as[t]: step t's decays, both [N][L];
    // ys[t]: step t's <h_t, C_t>, which the gate's gradient needs
    Lines states((steps + 1) * N * L), decays(steps * N * L), readouts(steps * L), decay_rates(N * L);
    Lines carry(N * L), grad_A(N * L), terms_C(N * L), terms_B(N * L);
    float *hs = states.data(), *as = decays.data(), *ys = readouts.data(), *At = decay_rates.data();
    float *g = carry.data(), *gA = grad_A.data(), *to_C = terms_C.data(), *to_B = terms_B.data();
    for (int64_t bg = begin; bg < end; ++bg) {
      const int64_t e0 = (bg % per_row) * L, row = (bg / per_row) * in.channels + e0;
      const Group grp{bg / per_row, e0, std::min(L, in.channels - e0)};
      alignas(64) float Dl[L] = {}, gD[L] = {};
      if (in.D) grp.pack_state(in.D, e0, 1, Dl);
      grp.pack_state(in.A, e0, N, At);
      grp.pack_state(in.h0, row, N, hs);
      for (int64_t t = 0; t < steps; ++t) {  // the forward again, keeping every state, decay and readout
        if (t + AHEAD < steps) {
          grp.prefetch(in.delta, in.sd, t + AHEAD);
          grp.prefetch(in.u, in.su, t + AHEAD);
        }
        alignas(64) float dt[L], dtu[L], acc[L] = {};
        grp.load(in.delta, in.sd, t, dt);
        grp.load(in.u, in.su, t, dtu);
        const float *B_t = in.B + grp.b * in.sBb + t * in.sBt, *C_t = in.C + grp.b * in.sCb + t * in.sCt;
        for (int64_t n = 0; n < N; ++n) {
          const float Bn = B_t[n], Cn = C_t[n], *An = At + n * L, *prev = hs + (t * N + n) * L;
          float *next = hs + ((t + 1) * N + n) * L, *a_t = as + (t * N + n) * L;
#pragma omp simd
          for (int64_t l = 0; l < L; ++l) {
            const float a = exp_lane(dt[l] * An[l]), v = a * prev[l] + dt[l] * dtu[l] * Bn;
            a_t[l] = a;
            next[l] = v;
            acc[l] += v * Cn;
          }
        }
        std::memcpy(ys + t * L, acc, sizeof(acc));
      }
      grp.pack_state(dlast_p, row, N, g);
      std::fill(gA, gA + N * L, 0.0f);
      float *dB_grp = out.dB + bg * steps * N, *dC_grp = out.dC + bg * steps * N;
      for (int64_t t = steps - 1; t >= 0; --t) {
        if (t >= AHEAD) {
          grp.prefetch(in.delta, in.sd, t - AHEAD);
          grp.prefetch(in.u, in.su, t - AHEAD);
          grp.prefetch(dy_p, sg, t - AHEAD);
          grp.prefetch(out.ddelta, out.sdd, t - AHEAD, true);
          grp.prefetch(out.du, out.sdu, t - AHEAD, true);
          if (in.z) {
            grp.prefetch(in.z, in.sz, t - AHEAD);
            grp.prefetch(out.dz, out.sdz, t - AHEAD, true);
          }
        }
        alignas(64) float dt[L], ut[L], gy[L], decay_part[L] = {}, input_part[L] = {};
        grp.load(in.delta, in.sd, t, dt);
        grp.load(in.u, in.su, t, ut);
        grp.load(dy_p, sg, t, gy);
        if (in.z) {  // y = (s + D u) silu(z): the scan's readout s gets dy silu(z)
          alignas(64) float zt[L], dz[L];
          grp.load(in.z, in.sz, t, zt);
#pragma omp simd
          for (int64_t l = 0; l < L; ++l) {
            const float sig = sigmoid_lane(zt[l]), pre = ys[t * L + l] + Dl[l] * ut[l];
            dz[l] = gy[l] * pre * sig * (1.0f + zt[l] * (1.0f - sig));
            gy[l] *= zt[l] * sig;
          }
          grp.store(dz, out.sdz, t, out.dz);
        }
        const float *B_t = in.B + grp.b * in.sBb + t * in.sBt, *C_t = in.C + grp.b * in.sCb + t * in.sCt;
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
          du[l] = dt[l] * input_part[l] + gy[l] * Dl[l];  // through the state, and through the skip D u
          gD[l] += gy[l] * ut[l];
        }
        grp.store(dd, out.sdd, t, out.ddelta);
        grp.store(du, out.sdu, t, out.du);
      }
      grp.unpack_state(g, row, N, out.dh0);
      grp.unpack_state(gA, row, N, out.dA);
      grp.unpack_state(gD, row, 1, out.dD);
    }
  });
}

}  // namespace

// u, delta, z [B, E, T] with unit stride in E; A [E, N]; Bm, Cm [B, T, N] (unit stride in N);
// h0 [B, E, N]; D [E]; an empty D or z for none
// -> y [B, E, T] (u's layout): (<h_t, C_t> + D u_t) silu(z_t), and the last state [B, E, N]
std::vector<at::Tensor> scan_forward(at::Tensor u, at::Tensor delta, at::Tensor A, at::Tensor Bm, at::Tensor Cm,
                                     at::Tensor h0, at::Tensor D, at::Tensor z) {
  const Inputs in = inputs(u, delta, A, Bm, Cm, h0, D, z);
  at::Tensor y = at::empty_like(u);
  at::Tensor last = at::empty({in.batch, in.channels, in.N}, u.options());
  forward(in, Strides(y), y.data_ptr<float>(), last.data_ptr<float>());
  return {y, last};
}

// the forward's inputs, dy [B, E, T] (unit stride in E) and dlast [B, E, N]
// -> du, ddelta [B, E, T], dA [E, N], dB, dC [B, T, N] (contiguous), dh0 [B, E, N], dD [E], dz like z
// (empty where D or z is)
std::vector<at::Tensor> scan_backward(at::Tensor u, at::Tensor delta, at::Tensor A, at::Tensor Bm, at::Tensor Cm,
                                      at::Tensor h0, at::Tensor D, at::Tensor z, at::Tensor dy, at::Tensor dlast) {
  const Inputs in = inputs(u, delta, A, Bm, Cm, h0, D, z);
  check_channel_minor(dy, "dy"); check(dlast, "dlast", 3);
  TORCH_CHECK(dlast.is_contiguous(), "dlast must be contiguous");
  const int64_t batch = in.batch, channels = in.channels, N = in.N;
  at::Tensor du = at::empty_like(u), ddelta = at::empty_like(delta), dz = at::empty_like(z);
  at::Tensor dh0 = at::empty({batch, channels, N}, u.options());
  at::Tensor dA_part = at::empty({batch, channels, N}, u.options()), dD_part = at::empty({batch, channels}, u.options());
  at::Tensor dB_part = at::empty({batch, groups(channels), in.steps, N}, u.options());
  at::Tensor dC_part = at::empty_like(dB_part);
  const Grads out{Strides(du), Strides(ddelta), z.numel() ? Strides(dz) : Strides(du), du.data_ptr<float>(),
                  ddelta.data_ptr<float>(), z.numel() ? dz.data_ptr<float>() : nullptr, dh0.data_ptr<float>(),
                  dA_part.data_ptr<float>(), dD_part.data_ptr<float>(), dB_part.data_ptr<float>(),
                  dC_part.data_ptr<float>()};
  backward(in, dy.data_ptr<float>(), Strides(dy), dlast.data_ptr<float>(), out);
  return {du, ddelta, dA_part.sum(0), dB_part.sum(1), dC_part.sum(1), dh0,
          D.numel() ? dD_part.sum(0) : at::empty_like(D), dz};
}
"""

# the vector extensions each capability torch reports may use (torch.backends.cpu.get_cpu_capability)
def _self_check(module) -> str | None:
    """Run the build on small odd shapes against the reference; None if forward and gradients agree."""
    from .naive import selective_scan_naive

    gen = torch.Generator().manual_seed(0)
    # two groups of channels and a part of one; N past 16 so that dB and dC take both of row_sums' paths
    b, e, n, t = 2, 2 * LANES + 3, 19, 19
    inputs = dict(u=torch.randn(b, e, t, generator=gen), delta=torch.randn(b, e, t, generator=gen),
                  A=-torch.rand(e, n, generator=gen) * 4, B=torch.randn(b, n, t, generator=gen),
                  C=torch.randn(b, n, t, generator=gen), D=torch.randn(e, generator=gen),
                  z=torch.randn(b, e, t, generator=gen), initial_state=torch.randn(b, e, n, generator=gen))
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
    """The recurrence with its skip and gate: (u, delta, A, B [B, T, N], C [B, T, N], h0, D, z) ->
    ((<h_t, C_t> + D u_t) silu(z_t) [B, E, T], h_T); an empty D or z stands for none."""

    @staticmethod
    def forward(ctx, module, u, delta, A, B_BTN, C_BTN, h0, D, z):
        y, last = module.scan_forward(u, delta, A, B_BTN, C_BTN, h0, D, z)
        ctx.module = module
        ctx.save_for_backward(u, delta, A, B_BTN, C_BTN, h0, D, z)
        return y, last

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, dlast):
        u, delta, A, B_BTN, C_BTN, h0, D, z = ctx.saved_tensors
        *grads, dD, dz = ctx.module.scan_backward(u, delta, A, B_BTN, C_BTN, h0, D, z, channel_minor(dy),
                                                  dlast.contiguous())
        return None, *grads, dD if D.numel() else None, dz if z.numel() else None


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

    none = u_BET.new_empty(0)
    y_BET, last_BEN = _Scan.apply(module, channel_minor(u_BET), channel_minor(delta_BET), A.float().contiguous(),
                                  time_major(B), time_major(C), h0_BEN,
                                  none if D is None else D.float().contiguous(),
                                  none if z is None else channel_minor(z.float()))
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
