"""Mamba-2 SSD scan, C++ CPU kernel: the chunked form of chunked.py compiled, with its own backward.

Same signature and return as `ssd_naive`; see tests/kernels/test_ssd_cpu.py. Dimensions: B batch,
T time, H heads, P head dim, G groups (head h reads group h // (H / G)), N state size, L = 16 steps
a chunk.

    a_t = exp(dt_t A);   S_t = a_t S_{t-1} + u_t B_t^T  (u_t = dt_t x_t);   y_t = S_t C_t

Why chunks. Stepping the recurrence costs 3 multiply-adds a state element and step forward (decay,
write, readout) and about 11 back, each a load and a store of the state. In chunks of L steps the
decays and writes of a chunk collapse into matrix products (the SSD paper's block decomposition,
https://arxiv.org/abs/2405.21060, section 6): with S the state entering a chunk, g_l = a_0 ... a_l
and E[l][s] = a_{s+1} ... a_l (s <= l),

    y_l = g_l S C_l + sum_{s <= l} E[l][s] (C_l . B_s) u_s        S_next = g_L S + sum_s E[L-1][s] u_s B_s^T

so a chunk forward is the scores C_l . B_s ([L, L] by N), the outputs from them ([L, L] by P) and two
[L, P] x N products with the state (readout and write): 2 P N multiply-adds a token in products
that keep their operands in registers, plus L (P + N). The backward is the same kind of products
(below), 4 P N a token, plus recomputing the chunks' start states (P N more); the recurrent form
needed 11 P N. L = 16 steps is one vector, so the [L, L] tiles and every product over steps use
whole vectors. Decays are products of the a_t, never differences of cumulative logs, so a strong
decay underflows to 0 as the reference's does and a weak one after it is not lost to rounding.

Backward, per (batch, head): the start state of every chunk is recomputed (one state write a chunk,
kept in a scratch of T / L states), then the chunks are walked from the last carrying dS, the
gradient of the chunk's end state. With M[l][s] = E[l][s] C_l . B_s and Q[l][s] = E[l][s] dy_l . u_s,

    du_s = sum_l M[l][s] dy_l + E[L-1][s] dS B_s          dS <- g_L dS + sum_l g_l dy_l C_l^T
    dC_l = g_l S^T dy_l + sum_s Q[l][s] B_s               dB_s = E[L-1][s] dS^T u_s + sum_l Q[l][s] C_l

and the gradient of each step's log decay dt_k A collects every product that holds a_k: g_l for
l >= k, E[L-1][s] for s < k, the whole chunk's g_L, and E[l][s] for s < k <= l. Then dx = dt du,
d dt = <du, x> + A d(log a), dA = sum dt d(log a).

Layouts. Every product is `gemm`: tiles of four rows by four vectors, or sixteen rows by one
vector, accumulating in registers. The forward keeps the state transposed, [N, P], so the readout
and the write both take vectors along P; the backward keeps it [P, N], so dB and dC come out by
step in rows along N and are stored as they are. The few operands needed the other way (B and C by
state column, u and dy by step) are transposed in 16 x 16 blocks, with AVX-512 shuffles where the
CPU has them. B and C are shared by a group's heads, so each head writes its own dB, dC
[B, T, H, N] and torch sums a group's heads (and dA over the batch), which keeps the result
independent of scheduling. The skip D x stays in PyTorch around the kernel.

Building: `SSD` (archsearch_kernels/cpu_build.py) compiles the source below on first use, once per Python
environment, and checks it against the reference on small odd shapes. If it does not compile or
does not agree, `available()` is False, the reason is in `build_error()`, and dispatch falls back
to the chunked PyTorch form (archsearch_kernels/dispatch.py).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from ..cpu_build import Extension, compare_scans

# steps a chunk: the C++ source's L, one vector of 16 floats (its tiles and transposes assume it)
CHUNK = 16

SOURCE = r"""
namespace {

using archsearch_cpu::Lines;

constexpr int64_t W = 16;  // floats in a vector
constexpr int64_t L = 16;  // steps in a chunk: one vector of them
typedef float vec __attribute__((vector_size(64)));

inline vec load(const float* p) { vec v; std::memcpy(&v, p, sizeof v); return v; }
inline void store(float* p, vec v) { std::memcpy(p, &v, sizeof v); }
inline float lane_sum(vec v) { float s = 0.0f; for (int64_t i = 0; i < W; ++i) s += v[i]; return s; }

// sum of x y over n floats, n a whole number of vectors (four sums in flight)
float dot(const float* x, const float* y, int64_t n) {
  vec acc[4] = {};
  int64_t i = 0;
  for (; i + 4 * W <= n; i += 4 * W)
    for (int k = 0; k < 4; ++k) acc[k] += load(x + i + k * W) * load(y + i + k * W);
  for (; i < n; i += W) acc[0] += load(x + i) * load(y + i);
  return lane_sum((acc[0] + acc[1]) + (acc[2] + acc[3]));
}

// I rows by K vectors of out = scale from + A Bm (from laid out as out, and may be out), A's entry (i, d)
// at a[i a_row + d a_col] and Bm's row d at b + d b_row; scale 0 starts from zero without reading from
template <int I, int K>
inline void tile(float* out, int64_t out_row, const float* from, float scale, const float* a, int64_t a_row,
                 int64_t a_col, const float* b, int64_t b_row, int64_t depth) {
  vec acc[I][K];
  for (int i = 0; i < I; ++i)
    for (int k = 0; k < K; ++k) acc[i][k] = scale == 0.0f ? vec{} : scale * load(from + i * out_row + k * W);
  for (int64_t d = 0; d < depth; ++d) {
    vec bk[K];
    for (int k = 0; k < K; ++k) bk[k] = load(b + d * b_row + k * W);
    for (int i = 0; i < I; ++i) {
      const float ai = a[i * a_row + d * a_col];
      for (int k = 0; k < K; ++k) acc[i][k] += ai * bk[k];
    }
  }
  for (int i = 0; i < I; ++i)
    for (int k = 0; k < K; ++k) store(out + i * out_row + k * W, acc[i][k]);
}

// out [rows, width] = scale from + A [rows, depth] Bm [depth, width], width a whole number of vectors.
// Four rows by four vectors a tile, or sixteen rows of one vector (best with A read down its columns, a_row 1)
void gemm(float* out, int64_t out_row, const float* from, float scale, const float* a, int64_t a_row, int64_t a_col,
          const float* b, int64_t b_row, int64_t rows, int64_t width, int64_t depth) {
  int64_t c = 0;
  for (; c + 4 * W <= width; c += 4 * W) {
    int64_t i = 0;
    for (; i + 4 <= rows; i += 4)
      tile<4, 4>(out + i * out_row + c, out_row, from + i * out_row + c, scale, a + i * a_row, a_row, a_col, b + c, b_row, depth);
    for (; i < rows; ++i)
      tile<1, 4>(out + i * out_row + c, out_row, from + i * out_row + c, scale, a + i * a_row, a_row, a_col, b + c, b_row, depth);
  }
  for (; c < width; c += W) {
    int64_t i = 0;
    for (; i + 16 <= rows; i += 16)
      tile<16, 1>(out + i * out_row + c, out_row, from + i * out_row + c, scale, a + i * a_row, a_row, a_col, b + c, b_row, depth);
    for (; i < rows; ++i)
      tile<1, 1>(out + i * out_row + c, out_row, from + i * out_row + c, scale, a + i * a_row, a_row, a_col, b + c, b_row, depth);
  }
}

// a 16 x 16 block: to[c to_row + r] = from[r from_row + c]
inline void transpose16(const float* from, int64_t from_row, float* to, int64_t to_row) {
#if defined(__AVX512F__)
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(from + i * from_row);
  for (int i = 0; i < 8; ++i) {  // per 128-bit lane k: a[4k], b[4k], a[4k+1], b[4k+1] and the same of 4k+2, 4k+3
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int g = 0; g < 4; ++g) {  // r[4g + j], lane k: column 4k + j of rows 4g .. 4g + 3
    r[4 * g] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
    r[4 * g + 1] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], 0xEE);
    r[4 * g + 2] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
    r[4 * g + 3] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xEE);
  }
  for (int j = 0; j < 4; ++j) {  // column 4k + j: lane k of r[j], r[4 + j], r[8 + j], r[12 + j]
    const __m512 even_lo = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x88), odd_lo = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xDD);
    const __m512 even_hi = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x88);
    const __m512 odd_hi = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xDD);
    _mm512_storeu_ps(to + j * to_row, _mm512_shuffle_f32x4(even_lo, even_hi, 0x88));
    _mm512_storeu_ps(to + (8 + j) * to_row, _mm512_shuffle_f32x4(even_lo, even_hi, 0xDD));
    _mm512_storeu_ps(to + (4 + j) * to_row, _mm512_shuffle_f32x4(odd_lo, odd_hi, 0x88));
    _mm512_storeu_ps(to + (12 + j) * to_row, _mm512_shuffle_f32x4(odd_lo, odd_hi, 0xDD));
  }
#else
  for (int64_t r = 0; r < 16; ++r)
    for (int64_t c = 0; c < 16; ++c) to[c * to_row + r] = from[r * from_row + c];
#endif
}

// from [rows, cols] -> to [cols, rows], both whole numbers of vectors
void transpose(const float* from, int64_t rows, int64_t cols, float* to) {
  for (int64_t r = 0; r < rows; r += W)
    for (int64_t c = 0; c < cols; c += W) transpose16(from + r * cols + c, cols, to + c * rows + r, rows);
}

struct Ssd {  // sizes; x [B, T, H, P], dt [B, T, H], Bm, Cm [B, T, G, N]; P and N padded to vectors: Pp, Np
  int64_t batch, steps, heads, P, groups, N;
  int64_t x_at(int64_t b, int64_t t, int64_t h) const { return ((b * steps + t) * heads + h) * P; }
  int64_t dt_at(int64_t b, int64_t t, int64_t h) const { return (b * steps + t) * heads + h; }
  int64_t bc_at(int64_t b, int64_t t, int64_t h) const {
    return ((b * steps + t) * groups + h / (heads / groups)) * N;
  }
  int64_t head_at(int64_t b, int64_t t, int64_t h) const { return ((b * steps + t) * heads + h) * N; }
  int64_t chunks() const { return (steps + L - 1) / L; }
  int64_t Pp() const { return (P + W - 1) / W * W; }
  int64_t Np() const { return (N + W - 1) / W * W; }
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

// rows [t0, t0 + L) of a [., width] tensor's (batch, head) into [L, padded], zeros past T and width
template <typename At>
void rows_in(const Ssd& s, const float* from, At at, int64_t t0, int64_t width, int64_t padded, float* to) {
  for (int64_t l = 0; l < L; ++l) {
    float* row = to + l * padded;
    const int64_t kept = t0 + l < s.steps ? width : 0;
    if (kept) std::memcpy(row, from + at(t0 + l), width * sizeof(float));
    std::fill(row + kept, row + padded, 0.0f);
  }
}

// one chunk of one (batch, head): decays a_l = exp(dt_l A) (1 past T), step sizes, x and u = dt x [L, Pp],
// B and C [L, Np] by step and [Np, L] by state column
struct Chunk {
  float a[L], dt[L];
  Lines xs, u, Bs, Cs, BT, CT;
  explicit Chunk(const Ssd& s) : xs(L * s.Pp()), u(L * s.Pp()), Bs(L * s.Np()), Cs(L * s.Np()), BT(s.Np() * L), CT(s.Np() * L) {}

  void fill(const Ssd& s, const float* x_p, const float* dt_p, float A, const float* B_p, const float* C_p,
            int64_t b, int64_t h, int64_t t0, bool transposed) {
    const int64_t Pp = s.Pp(), Np = s.Np();
    rows_in(s, x_p, [&](int64_t t) { return s.x_at(b, t, h); }, t0, s.P, Pp, xs.data());
    rows_in(s, B_p, [&](int64_t t) { return s.bc_at(b, t, h); }, t0, s.N, Np, Bs.data());
    rows_in(s, C_p, [&](int64_t t) { return s.bc_at(b, t, h); }, t0, s.N, Np, Cs.data());
    for (int64_t l = 0; l < L; ++l) {
      dt[l] = t0 + l < s.steps ? dt_p[s.dt_at(b, t0 + l, h)] : 0.0f;
      a[l] = std::exp(dt[l] * A);
      for (int64_t p = 0; p < Pp; p += W) store(u.data() + l * Pp + p, dt[l] * load(xs.data() + l * Pp + p));
    }
    if (transposed) {
      transpose(Bs.data(), L, Np, BT.data());
      transpose(Cs.data(), L, Np, CT.data());
    }
  }
};

// the decays within one chunk: E[l][s] = a_{s+1} ... a_l for s <= l (0 above), g[l] = a_0 ... a_l,
// so the state after step l is g[l] S + sum_{s <= l} E[l][s] u_s B_s^T for S the chunk's start state
struct Decays {
  alignas(64) float E[L][L];
  alignas(64) float g[L];
  explicit Decays(const float* a) {
    float run = 1.0f;
    for (int64_t l = 0; l < L; ++l) {
      for (int64_t s = 0; s < L; ++s) E[l][s] = s < l ? E[l - 1][s] * a[l] : (s == l ? 1.0f : 0.0f);
      run *= a[l];
      g[l] = run;
    }
  }
  const float* w() const { return E[L - 1]; }  // from each step to the chunk's end
  float whole() const { return g[L - 1]; }      // over the whole chunk
};

// M[l][s] = E[l][s] C_l . B_s: the chunk's outputs from its own inputs are M u
void scores(const Ssd& s, const Chunk& ch, const Decays& d, float* M) {
  gemm(M, L, M, 0.0f, ch.CT.data(), 1, L, ch.BT.data(), L, L, W, s.Np());
  for (int64_t l = 0; l < L; ++l) store(M + l * L, load(M + l * L) * load(d.E[l]));
}

// uw[s] = w_s u_s: each step's input decayed to the chunk's end
void to_end(const Ssd& s, const Chunk& ch, const Decays& d, float* uw) {
  const int64_t Pp = s.Pp();
  for (int64_t l = 0; l < L; ++l)
    for (int64_t p = 0; p < Pp; p += W) store(uw + l * Pp + p, d.w()[l] * load(ch.u.data() + l * Pp + p));
}

// a [P, N] state into [Pp, Np] floats, zeros past P and N, and back
void state_in(const Ssd& s, const float* S_bh, float* to) {
  const int64_t Np = s.Np();
  std::fill(to, to + s.Pp() * Np, 0.0f);
  for (int64_t p = 0; p < s.P; ++p) std::memcpy(to + p * Np, S_bh + p * s.N, s.N * sizeof(float));
}

void state_out(const Ssd& s, const float* from, float* S_bh) {
  for (int64_t p = 0; p < s.P; ++p) std::memcpy(S_bh + p * s.N, from + p * s.Np(), s.N * sizeof(float));
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
  const int64_t Pp = s.Pp(), Np = s.Np(), PN = s.P * s.N;
  at::parallel_for(0, s.batch * s.heads, 1, [&](int64_t begin, int64_t end) {
    Chunk ch(s);
    // the state as [Np, Pp]: row n holds column n of every row of S
    Lines S(Pp * Np), ST(Np * Pp), M(L * L), intra(L * Pp), readout(L * Pp), uw(L * Pp);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / s.heads, h = bh % s.heads;
      state_in(s, S0_p + bh * PN, S.data());
      transpose(S.data(), Pp, Np, ST.data());
      for (int64_t t0 = 0; t0 < s.steps; t0 += L) {
        ch.fill(s, x_p, dt_p, A_p[h], B_p, C_p, b, h, t0, true);
        const Decays d(ch.a);
        scores(s, ch, d, M.data());
        gemm(intra.data(), Pp, intra.data(), 0.0f, M.data(), L, 1, ch.u.data(), Pp, L, Pp, L);
        gemm(readout.data(), Pp, readout.data(), 0.0f, ch.Cs.data(), Np, 1, ST.data(), Pp, L, Pp, Np);
        for (int64_t l = 0; l < L && t0 + l < s.steps; ++l) {
          float* y_t = y_p + s.x_at(b, t0 + l, h);
          for (int64_t p = 0; p < s.P; ++p) y_t[p] = intra[l * Pp + p] + d.g[l] * readout[l * Pp + p];
        }
        // ST = g_L ST + sum_s B_s (w_s u_s)^T
        to_end(s, ch, d, uw.data());
        gemm(ST.data(), Pp, ST.data(), d.whole(), ch.Bs.data(), 1, Np, uw.data(), Pp, Np, Pp, L);
      }
      transpose(ST.data(), Np, Pp, S.data());
      state_out(s, S.data(), last_p + bh * PN);
    }
  });
  return {y, last};
}

// the forward's inputs, dy [B, T, H, P] and dlast [B, H, P, N]
// -> dx [B, T, H, P], ddt [B, T, H], dA [H], dB, dC per head [B, T, H, N], dS0 [B, H, P, N]
std::vector<at::Tensor> ssd_backward(at::Tensor x, at::Tensor dt, at::Tensor A, at::Tensor Bm, at::Tensor Cm,
                                     at::Tensor S0, at::Tensor dy, at::Tensor dlast) {
  const Ssd s = sizes(x, dt, A, Bm, Cm, S0);
  check(dy, "dy", 4); check(dlast, "dlast", 4);
  const int64_t Pp = s.Pp(), Np = s.Np(), PN = s.P * s.N, chunks = s.chunks(), block = Pp * Np;
  at::Tensor dx = at::empty_like(x), ddt = at::empty_like(dt), dS0 = at::empty_like(S0);
  at::Tensor dA_part = at::empty({s.batch, s.heads}, x.options());
  at::Tensor dB = at::empty({s.batch, s.steps, s.heads, s.N}, x.options()), dC = at::empty_like(dB);
  const float *x_p = x.data_ptr<float>(), *dt_p = dt.data_ptr<float>(), *A_p = A.data_ptr<float>();
  const float *B_p = Bm.data_ptr<float>(), *C_p = Cm.data_ptr<float>(), *S0_p = S0.data_ptr<float>();
  const float *dy_p = dy.data_ptr<float>(), *dlast_p = dlast.data_ptr<float>();
  float *dx_p = dx.data_ptr<float>(), *ddt_p = ddt.data_ptr<float>(), *dS0_p = dS0.data_ptr<float>();
  float *dA_p = dA_part.data_ptr<float>(), *dB_p = dB.data_ptr<float>(), *dC_p = dC.data_ptr<float>();
  at::parallel_for(0, s.batch * s.heads, 1, [&](int64_t begin, int64_t end) {
    Chunk ch(s);
    // states as [Pp, Np] (S's own layout): the one entering each chunk, and dS
    Lines starts((chunks + 1) * block), dS(block), uw(L * Pp), uT(Pp * L), gy(L * Pp), gyT(Pp * L), gyg(L * Pp);
    Lines M(L * L), Dyu(L * L), Q(L * L), du(L * Pp), dx_row(Pp), dSBT(Pp * L), dSB(L * Pp), dBc(L * Np), dCc(L * Np);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / s.heads, h = bh % s.heads;
      const float A_h = A_p[h];
      state_in(s, S0_p + bh * PN, starts.data());
      for (int64_t c = 0; c < chunks; ++c) {  // S = g_L S + sum_s (w_s u_s) B_s^T
        ch.fill(s, x_p, dt_p, A_h, B_p, C_p, b, h, c * L, false);
        const Decays d(ch.a);
        to_end(s, ch, d, uw.data());
        float* next = starts.data() + (c + 1) * block;
        gemm(next, Np, next - block, d.whole(), uw.data(), 1, Pp, ch.Bs.data(), Np, Pp, Np, L);
      }
      state_in(s, dlast_p + bh * PN, dS.data());
      float dA = 0.0f;
      for (int64_t c = chunks - 1; c >= 0; --c) {
        const int64_t t0 = c * L;
        const float* S = starts.data() + c * block;
        ch.fill(s, x_p, dt_p, A_h, B_p, C_p, b, h, t0, true);
        rows_in(s, dy_p, [&](int64_t t) { return s.x_at(b, t, h); }, t0, s.P, Pp, gy.data());
        transpose(ch.u.data(), L, Pp, uT.data());
        transpose(gy.data(), L, Pp, gyT.data());
        const Decays d(ch.a);
        scores(s, ch, d, M.data());
        to_end(s, ch, d, uw.data());
        for (int64_t l = 0; l < L; ++l)
          for (int64_t p = 0; p < Pp; p += W) store(gyg.data() + l * Pp + p, d.g[l] * load(gy.data() + l * Pp + p));
        // Dyu[l][s] = dy_l . u_s, and Q = E Dyu: the gradient of the scores C_l . B_s
        gemm(Dyu.data(), L, Dyu.data(), 0.0f, gyT.data(), 1, L, uT.data(), L, L, W, Pp);
        for (int64_t l = 0; l < L; ++l) store(Q.data() + l * L, load(Dyu.data() + l * L) * load(d.E[l]));
        // du_s = sum_l M[l][s] dy_l + w_s dS B_s  (dS the gradient of the chunk's end state)
        gemm(du.data(), Pp, du.data(), 0.0f, M.data(), 1, L, gy.data(), Pp, L, Pp, L);
        gemm(dSBT.data(), L, dSBT.data(), 0.0f, dS.data(), Np, 1, ch.BT.data(), L, Pp, W, Np);
        for (int64_t p = 0; p < Pp; p += W) transpose16(dSBT.data() + p * L, L, dSB.data() + p, Pp);
        for (int64_t l = 0; l < L; ++l)
          for (int64_t p = 0; p < Pp; p += W)
            store(du.data() + l * Pp + p, load(du.data() + l * Pp + p) + d.w()[l] * load(dSB.data() + l * Pp + p));
        // dC_l = g_l S^T dy_l + sum_s Q[l][s] B_s;  dB_s = w_s dS^T u_s + sum_l Q[l][s] C_l
        gemm(dCc.data(), Np, dCc.data(), 0.0f, gyg.data(), Pp, 1, S, Np, L, Np, Pp);
        gemm(dBc.data(), Np, dBc.data(), 0.0f, uw.data(), Pp, 1, dS.data(), Np, L, Np, Pp);
        float through_g[L], through_w[L];  // the parts of the decay gradient through g_l and w_s
        for (int64_t l = 0; l < L; ++l) {
          through_g[l] = dot(ch.Cs.data() + l * Np, dCc.data() + l * Np, Np);
          through_w[l] = dot(ch.Bs.data() + l * Np, dBc.data() + l * Np, Np);
        }
        gemm(dCc.data(), Np, dCc.data(), 1.0f, Q.data(), L, 1, ch.Bs.data(), Np, L, Np, L);
        gemm(dBc.data(), Np, dBc.data(), 1.0f, Q.data(), 1, L, ch.Cs.data(), Np, L, Np, L);
        // through the whole chunk's decay, then dS for the chunk before: g_L dS + sum_l g_l dy_l C_l^T
        const float through_all = d.whole() * dot(dS.data(), S, block);
        gemm(dS.data(), Np, dS.data(), d.whole(), gyg.data(), 1, Pp, ch.Cs.data(), Np, Pp, Np, L);
        // the gradient of each step's log decay dt_k A: every product of decays that holds a_k,
        // g_l (l >= k), w_s (s < k), the whole chunk's, and E[l][s] (s < k <= l)
        alignas(64) float cols[L][L];  // cols[l][k] = sum_{s < k} M[l][s] Dyu[l][s], for l >= k
        for (int64_t l = 0; l < L; ++l) {
          float run = 0.0f;
          for (int64_t k = 0; k < L; ++k) {
            cols[l][k] = run;
            if (k < l) run += M[l * L + k] * Dyu[l * L + k];
          }
        }
        float dlog[L];
        vec inner = {};
        float after = 0.0f, before = 0.0f;
        for (int64_t k = L - 1; k >= 0; --k) {
          inner += load(cols[k]);
          after += through_g[k];
          dlog[k] = through_all + after + inner[k];
        }
        for (int64_t k = 0; k < L; ++k) {
          dlog[k] += before;
          before += through_w[k];
        }
        for (int64_t k = 0; k < L && t0 + k < s.steps; ++k) {
          const int64_t t = t0 + k;
          for (int64_t p = 0; p < Pp; p += W) store(dx_row.data() + p, ch.dt[k] * load(du.data() + k * Pp + p));
          std::memcpy(dx_p + s.x_at(b, t, h), dx_row.data(), s.P * sizeof(float));
          const float through_u = dot(du.data() + k * Pp, ch.xs.data() + k * Pp, Pp);
          ddt_p[s.dt_at(b, t, h)] = through_u + dlog[k] * A_h;
          dA += dlog[k] * ch.dt[k];
          std::memcpy(dB_p + s.head_at(b, t, h), dBc.data() + k * Np, s.N * sizeof(float));
          std::memcpy(dC_p + s.head_at(b, t, h), dCc.data() + k * Np, s.N * sizeof(float));
        }
      }
      state_out(s, dS.data(), dS0_p + bh * PN);
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
    # two whole chunks and a ragged one; P 19 and N 67 are a block of four vectors, one of a part and padding
    b, t, h, g, p, n = 2, 2 * CHUNK + 3, 4, 2, 19, 67
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
            x, dt, A, B_BTGN, C_BTGN, S0, dy.contiguous(), dlast.contiguous())
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
    """SSD through the compiled CPU kernel; matches `ssd_naive`.

    Args:
        x: [B, T, H, P] input.
        dt: [B, T, H] step size (positive).
        A: [H] per-head decay rate (negative for a decaying state).
        B: [B, T, G, N] input matrix.
        C: [B, T, G, N] output matrix.
        D: [H] skip weight, or None for no skip.
        initial_state: [B, H, P, N] state before the first step; zeros if None.
        return_last_state: also return the state after the last step.
        chunk_size: accepted for the chunked PyTorch form's signature and unused: the kernel's
            chunks are `CHUNK` steps.

    Returns:
        y [B, T, H, P] in x's dtype, or (y, last_state) with last_state [B, H, P, N] in fp32.

    Raises:
        RuntimeError: the kernel did not build or failed its check here (`build_error` says why);
            dispatch checks `available` first and takes the PyTorch path instead.
    """
    return _ssd(SSD.require("ssd"), x, dt, A, B, C, D, initial_state=initial_state,
                return_last_state=return_last_state)
