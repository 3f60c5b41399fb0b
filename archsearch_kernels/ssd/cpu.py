"""Mamba-2 SSD scan, C++ CPU kernel: the chunked form of chunked.py compiled, with its own backward.

Same signature and return as `ssd_naive`; see tests/kernels/test_ssd_cpu.py. Dimensions: B batch,
T time, H heads, P head dim, G groups (head h reads group h // (H / G)), N state size, L = 16 steps
a chunk (`CHUNK`): one vector of floats with AVX-512, two with AVX2.

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
needed 11 P N. L steps are a whole number of vectors, so the [L, L] tiles and every product over
steps use whole vectors. Three of the state-sized products a token (the forward's write, the
backward's recomputed write and its dS update) sum over the L steps of a chunk alone, and each of
their register tiles loads and stores its accumulators once for L multiply-adds an accumulator:
against 16-step chunks, forward and backward took 1.06x the time with 8-step ones (one AVX2
vector) and 1.13x with 32-step ones (B 8, T 256, 4 heads of 64, N 128, AVX2, one thread, median
of 40 interleaved calls of the three builds in one process). Decays are products of the a_t,
never differences of cumulative logs, so a strong decay underflows to 0 as the reference's does
and a weak one after it is not lost to rounding.

Backward, one head at a time: the head's state entering every chunk is recomputed (one state
write a chunk, kept in a thread's scratch of T / L + 1 states, 4.2 MB at T 2048 with P 64, N 128
and L 16),
then its chunks are walked from the last carrying dS, the gradient of the chunk's end state
(`HeadBack`). With M[l][s] = E[l][s] C_l . B_s and Q[l][s] = E[l][s] dy_l . u_s,

    du_s = sum_l M[l][s] dy_l + E[L-1][s] dS B_s          dS <- g_L dS + sum_l g_l dy_l C_l^T
    dC_l = g_l S^T dy_l + sum_s Q[l][s] B_s               dB_s = E[L-1][s] dS^T u_s + sum_l Q[l][s] C_l

and the gradient of each step's log decay dt_k A collects every product that holds a_k: g_l for
l >= k, E[L-1][s] for s < k, the whole chunk's g_L, and E[l][s] for s < k <= l. Then dx = dt du,
d dt = <du, x> + A d(log a), dA = sum dt d(log a).

Layouts. Every product is `gemm`: tiles that accumulate in registers, sized to the ISA's (four
rows by four vectors or sixteen rows by one in AVX-512's 32, four by two or eight by one in
AVX2's 16). The vector is the registers' width: GCC lowers a wider vector type through the
stack, which on an AVX2 CPU made the scan several times slower than the PyTorch form. The forward keeps the state transposed, [N, P], so the readout
and the write both take vectors along P; the backward keeps it [P, N], so dB and dC come out by
step in rows along N and are stored as they are. The few operands needed the other way (B and C by
state column, u and dy by step) are transposed in W x W blocks, with AVX-512 or AVX2 shuffles
where the CPU has them.

Work is split by (batch, group) over torch's threads. In the forward a chunk's B and C rows, their
transposes and the scores C_l . B_s are formed once and used by each of the group's heads in turn;
the backward forms them again for each head, so that a thread's scratch holds one head's states, not
a group's. The heads' dB and dC are summed in a fixed order, so the result does not depend on
scheduling. (With fewer (batch, group) pairs than threads some threads idle; Mamba-2 layers have
one group by default.) x, B and C are read in place when only their rows are contiguous (the views a
layer's split of its projection gives). The skip D x is taken inside too: y gains D x, dx gains
D dy, and dD sums <dy, x>.

Building: `SSD` (archsearch_kernels/cpu_build.py) compiles the source below on first use, once per Python
environment, and checks it against the reference on small odd shapes. If it does not compile or
does not agree, `available()` is False, the reason is in `build_error()`, and dispatch falls back
to the chunked PyTorch form (archsearch_kernels/dispatch.py).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from ..cpu_build import Extension, compare_scans

# steps a chunk: the C++ source's L (one AVX-512 vector, two AVX2 ones)
CHUNK = 16

SOURCE = r"""
namespace {

using archsearch_cpu::Lines;

// floats in a vector: a register's on AVX-512, on AVX2 (and the baseline) a 32-byte one, because a vector
// type wider than the registers is lowered through the stack and runs several times slower
#if defined(__AVX512F__)
#define SSD_W 16
#else
#define SSD_W 8
#endif
constexpr int64_t W = SSD_W;
constexpr int64_t L = 16;  // steps in a chunk: one AVX-512 vector of them, two AVX2 ones
typedef float vec __attribute__((vector_size(4 * SSD_W)));

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

// the tiles of I rows by K vectors down rows [0, rows) at column c, then the rows past the last whole tile
template <int I, int K>
inline void tile_rows(float* out, int64_t out_row, const float* from, float scale, const float* a, int64_t a_row,
                      int64_t a_col, const float* b, int64_t b_row, int64_t depth, int64_t rows, int64_t c) {
  int64_t i = 0;
  for (; i + I <= rows; i += I)
    tile<I, K>(out + i * out_row + c, out_row, from + i * out_row + c, scale, a + i * a_row, a_row, a_col, b + c,
               b_row, depth);
  for (; i < rows; ++i)
    tile<1, K>(out + i * out_row + c, out_row, from + i * out_row + c, scale, a + i * a_row, a_row, a_col, b + c,
               b_row, depth);
}

// the register tiles, sized so that accumulators and operands fit the ISA's vector registers: on AVX-512
// (32 registers) four rows by four vectors, or sixteen rows of one vector (best with A read down its
// columns, a_row 1); on AVX2 (16) four rows by two vectors, or eight rows of one
#if defined(__AVX512F__)
constexpr int WIDE_ROWS = 4, WIDE_VECTORS = 4, NARROW_ROWS = 16;
#else
constexpr int WIDE_ROWS = 4, WIDE_VECTORS = 2, NARROW_ROWS = 8;
#endif

// out [rows, width] = scale from + A [rows, depth] Bm [depth, width], width a whole number of vectors
void gemm(float* out, int64_t out_row, const float* from, float scale, const float* a, int64_t a_row, int64_t a_col,
          const float* b, int64_t b_row, int64_t rows, int64_t width, int64_t depth) {
  int64_t c = 0;
  for (; c + WIDE_VECTORS * W <= width; c += WIDE_VECTORS * W)
    tile_rows<WIDE_ROWS, WIDE_VECTORS>(out, out_row, from, scale, a, a_row, a_col, b, b_row, depth, rows, c);
  for (; c < width; c += W)
    tile_rows<NARROW_ROWS, 1>(out, out_row, from, scale, a, a_row, a_col, b, b_row, depth, rows, c);
}

// a W x W block: to[c to_row + r] = from[r from_row + c]
inline void transpose_block(const float* from, int64_t from_row, float* to, int64_t to_row) {
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
    const __m512 even_lo = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x88);
    const __m512 odd_lo = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xDD);
    const __m512 even_hi = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x88);
    const __m512 odd_hi = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xDD);
    _mm512_storeu_ps(to + j * to_row, _mm512_shuffle_f32x4(even_lo, even_hi, 0x88));
    _mm512_storeu_ps(to + (8 + j) * to_row, _mm512_shuffle_f32x4(even_lo, even_hi, 0xDD));
    _mm512_storeu_ps(to + (4 + j) * to_row, _mm512_shuffle_f32x4(odd_lo, odd_hi, 0x88));
    _mm512_storeu_ps(to + (12 + j) * to_row, _mm512_shuffle_f32x4(odd_lo, odd_hi, 0xDD));
  }
#elif defined(__AVX2__)
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(from + i * from_row);
  for (int i = 0; i < 4; ++i) {  // per 128-bit half k: a[4k], b[4k], a[4k+1], b[4k+1] and the same of 4k+2, 4k+3
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int g = 0; g < 2; ++g) {  // r[4g + j], half k: column 4k + j of rows 4g .. 4g + 3
    r[4 * g] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
    r[4 * g + 1] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], 0xEE);
    r[4 * g + 2] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
    r[4 * g + 3] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xEE);
  }
  for (int j = 0; j < 4; ++j) {  // column j: the low halves of r[j] and r[4 + j]; column 4 + j: the high ones
    _mm256_storeu_ps(to + j * to_row, _mm256_permute2f128_ps(r[j], r[4 + j], 0x20));
    _mm256_storeu_ps(to + (4 + j) * to_row, _mm256_permute2f128_ps(r[j], r[4 + j], 0x31));
  }
#else
  for (int64_t r = 0; r < W; ++r)
    for (int64_t c = 0; c < W; ++c) to[c * to_row + r] = from[r * from_row + c];
#endif
}

// from [rows, cols] -> to [cols, rows], both whole numbers of vectors
void transpose(const float* from, int64_t rows, int64_t cols, float* to) {
  for (int64_t r = 0; r < rows; r += W)
    for (int64_t c = 0; c < cols; c += W) transpose_block(from + r * cols + c, cols, to + c * rows + r, rows);
}

struct View {  // a float tensor's elements by (batch, time, head or group); its last dim is contiguous
  const float* data;
  int64_t b, t, i;
  const float* at(int64_t bi, int64_t ti, int64_t ii) const { return data + bi * b + ti * t + ii * i; }
};

View view_of(const at::Tensor& x) { return {x.data_ptr<float>(), x.stride(0), x.stride(1), x.stride(2)}; }

struct Ssd {  // sizes: x [B, T, H, P], dt [B, T, H], Bm, Cm [B, T, G, N]; P and N padded to vectors: Pp, Np
  int64_t batch, steps, heads, P, groups, N;
  int64_t per_group() const { return heads / groups; }
  int64_t chunks() const { return (steps + L - 1) / L; }
  int64_t Pp() const { return (P + W - 1) / W * W; }
  int64_t Np() const { return (N + W - 1) / W * W; }
  int64_t block() const { return Pp() * Np(); }  // one head's padded state
};

// float32 CPU tensors of `dim` dims whose last dim is contiguous (rows may be views into a wider tensor)
void check(const at::Tensor& x, const char* name, int64_t dim) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.device().is_cpu() && x.dim() == dim && x.stride(dim - 1) == 1,
              name, ": expected a float32 CPU tensor of ", dim, " dims with a contiguous last dim");
}

Ssd sizes(const at::Tensor& x, const at::Tensor& dt, const at::Tensor& A, const at::Tensor& Bm,
          const at::Tensor& Cm, const at::Tensor& D, const at::Tensor& S0) {
  check(x, "x", 4); check(dt, "dt", 3); check(A, "A", 1); check(Bm, "B", 4); check(Cm, "C", 4); check(D, "D", 1);
  check(S0, "initial_state", 4);
  TORCH_CHECK(S0.is_contiguous() && A.size(0) == x.size(2) && D.size(0) == x.size(2), "A, D [H] and a contiguous S0");
  Ssd s{x.size(0), x.size(1), x.size(2), x.size(3), Bm.size(2), Bm.size(3)};
  TORCH_CHECK(s.heads % s.groups == 0, "heads must split evenly over groups");
  TORCH_CHECK(Cm.sizes() == Bm.sizes() && Bm.size(0) == s.batch && Bm.size(1) == s.steps,
              "B and C must be [B, T, G, N]");
  return s;
}

// rows [t0, t0 + L) of a view's (batch b, head or group i) into [L, padded], zeros past T and width
void rows_in(const Ssd& s, const View& v, int64_t b, int64_t i, int64_t t0, int64_t width, int64_t padded,
             float* to) {
  for (int64_t l = 0; l < L; ++l) {
    float* row = to + l * padded;
    const int64_t kept = t0 + l < s.steps ? width : 0;
    if (kept) std::memcpy(row, v.at(b, t0 + l, i), width * sizeof(float));
    std::fill(row + kept, row + padded, 0.0f);
  }
}

// one chunk's B and C for a (batch, group): by step [L, Np], by state column [Np, L], and the scores
// Sc[l][s] = C_l . B_s, shared by the group's heads
struct GroupChunk {
  Lines Bs, Cs, BT, CT, Sc;
  explicit GroupChunk(const Ssd& s) : Bs(L * s.Np()), Cs(L * s.Np()), BT(s.Np() * L), CT(s.Np() * L), Sc(L * L) {}

  void fill(const Ssd& s, const View& Bv, const View& Cv, int64_t b, int64_t g, int64_t t0, bool whole) {
    const int64_t Np = s.Np();
    rows_in(s, Bv, b, g, t0, s.N, Np, Bs.data());
    if (!whole) return;  // the state write needs B alone
    rows_in(s, Cv, b, g, t0, s.N, Np, Cs.data());
    transpose(Bs.data(), L, Np, BT.data());
    transpose(Cs.data(), L, Np, CT.data());
    gemm(Sc.data(), L, Sc.data(), 0.0f, CT.data(), 1, L, BT.data(), L, L, L, Np);
  }
};

// one head's part of a chunk: decays a_l = exp(dt_l A) (1 past T), step sizes, x and u = dt x [L, Pp]
struct HeadChunk {
  float a[L], dt[L];
  Lines xs, u;
  explicit HeadChunk(const Ssd& s) : xs(L * s.Pp()), u(L * s.Pp()) {}

  void fill(const Ssd& s, const View& xv, const View& dtv, float A, int64_t b, int64_t h, int64_t t0) {
    const int64_t Pp = s.Pp();
    rows_in(s, xv, b, h, t0, s.P, Pp, xs.data());
    for (int64_t l = 0; l < L; ++l) {
      dt[l] = t0 + l < s.steps ? *dtv.at(b, t0 + l, h) : 0.0f;
      a[l] = std::exp(dt[l] * A);
      for (int64_t p = 0; p < Pp; p += W) store(u.data() + l * Pp + p, dt[l] * load(xs.data() + l * Pp + p));
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

// to[l][s] = E[l][s] from[l][s] over a chunk's [L, L] step pairs: the scores C_l . B_s give M, whose
// M u is a head's outputs of a chunk from the chunk's own inputs; dy_l . u_s gives Q, the scores' gradient
void decayed(const Decays& d, const float* from, float* to) {
  for (int64_t l = 0; l < L; ++l)
    for (int64_t s = 0; s < L; s += W) store(to + l * L + s, load(from + l * L + s) * load(d.E[l] + s));
}

// to[l] = factor[l] from[l] for a chunk's L rows of `width` floats (u_s decayed to the chunk's end by w_s,
// dy_l by g_l)
void scaled_rows(const float* from, const float* factor, int64_t width, float* to) {
  for (int64_t l = 0; l < L; ++l)
    for (int64_t i = 0; i < width; i += W) store(to + l * width + i, factor[l] * load(from + l * width + i));
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

// a row of n floats into `to`: stored, or added to what is there
void rows_out(const float* from, int64_t n, bool add, float* to) {
  if (!add) {
    std::memcpy(to, from, n * sizeof(float));
    return;
  }
  for (int64_t i = 0; i < n; ++i) to[i] += from[i];
}

// outputs are passed in, each contiguous and of the shape its comment gives
void check_out(const at::Tensor& out, at::IntArrayRef shape, const char* name) {
  TORCH_CHECK(out.scalar_type() == at::kFloat && out.is_contiguous() && out.sizes() == shape, name,
              ": expected a contiguous float32 tensor of shape ", shape);
}

// the gradient of each step's log decay dt_k A in a chunk: every product of decays that holds a_k,
// g_l (l >= k), w_s (s < k), the whole chunk's, and E[l][s] (s < k <= l), given the parts of the loss's
// change through each g_l, each w_s and the whole, and the scores' M and Dyu
void log_decay_grads(const float* M, const float* Dyu, const float* through_g, const float* through_w,
                     float through_all, float* dlog) {
  alignas(64) float cols[L][L];  // cols[l][k] = sum_{s < k} M[l][s] Dyu[l][s], for l >= k
  for (int64_t l = 0; l < L; ++l) {
    float run = 0.0f;
    for (int64_t k = 0; k < L; ++k) {
      cols[l][k] = run;
      if (k < l) run += M[l * L + k] * Dyu[l * L + k];
    }
  }
  alignas(64) float inner[L] = {};  // inner[j] = sum over l >= k of cols[l][j]
  float after = 0.0f, before = 0.0f;
  for (int64_t k = L - 1; k >= 0; --k) {
    for (int64_t j = 0; j < L; j += W) store(inner + j, load(inner + j) + load(cols[k] + j));
    after += through_g[k];
    dlog[k] = through_all + after + inner[k];
  }
  for (int64_t k = 0; k < L; ++k) {
    dlog[k] += before;
    before += through_w[k];
  }
}

// one head's chunk of the walk back, with its scratch. `chunk` turns dS, the gradient of the chunk's end
// state, into that of its start state, adds the head's dB and dC into its group's [L, Np] rows, writes
// its dx and ddt rows and adds to its dA and dD
struct HeadBack {
  Lines uw, uT, gy, gyT, gyg, M, Dyu, Q, du, dSBT, dSB, dx_row, dBh, dCh;
  explicit HeadBack(const Ssd& s)
      : uw(L * s.Pp()), uT(s.Pp() * L), gy(L * s.Pp()), gyT(s.Pp() * L), gyg(L * s.Pp()), M(L * L), Dyu(L * L),
        Q(L * L), du(L * s.Pp()), dSBT(s.Pp() * L), dSB(L * s.Pp()), dx_row(s.Pp()), dBh(L * s.Np()),
        dCh(L * s.Np()) {}

  void chunk(const Ssd& s, const GroupChunk& gc, const HeadChunk& hc, const View& dyv, float A_h, float D_h,
             int64_t b, int64_t h, int64_t t0, const float* S, float* dS, float* dBg, float* dCg, float* dx_p,
             float* ddt_p, float& dA, float& dD) {
    const int64_t Pp = s.Pp(), Np = s.Np();
    const float *B_c = gc.Bs.data(), *C_c = gc.Cs.data();
    rows_in(s, dyv, b, h, t0, s.P, Pp, gy.data());
    transpose(hc.u.data(), L, Pp, uT.data());
    transpose(gy.data(), L, Pp, gyT.data());
    const Decays d(hc.a);
    decayed(d, gc.Sc.data(), M.data());
    scaled_rows(hc.u.data(), d.w(), Pp, uw.data());
    scaled_rows(gy.data(), d.g, Pp, gyg.data());
    // Dyu[l][s] = dy_l . u_s, and Q = E Dyu: the gradient of the scores C_l . B_s
    gemm(Dyu.data(), L, Dyu.data(), 0.0f, gyT.data(), 1, L, uT.data(), L, L, L, Pp);
    decayed(d, Dyu.data(), Q.data());
    // du_s = sum_l M[l][s] dy_l + w_s dS B_s
    gemm(du.data(), Pp, du.data(), 0.0f, M.data(), 1, L, gy.data(), Pp, L, Pp, L);
    gemm(dSBT.data(), L, dSBT.data(), 0.0f, dS, Np, 1, gc.BT.data(), L, Pp, L, Np);
    transpose(dSBT.data(), Pp, L, dSB.data());
    for (int64_t l = 0; l < L; ++l)
      for (int64_t p = 0; p < Pp; p += W)
        store(du.data() + l * Pp + p, load(du.data() + l * Pp + p) + d.w()[l] * load(dSB.data() + l * Pp + p));
    // dC_l = g_l S^T dy_l + sum_s Q[l][s] B_s;  dB_s = w_s dS^T u_s + sum_l Q[l][s] C_l
    gemm(dCh.data(), Np, dCh.data(), 0.0f, gyg.data(), Pp, 1, S, Np, L, Np, Pp);
    gemm(dBh.data(), Np, dBh.data(), 0.0f, uw.data(), Pp, 1, dS, Np, L, Np, Pp);
    float through_g[L], through_w[L];  // the parts of the decay gradient through g_l and w_s
    for (int64_t l = 0; l < L; ++l) {
      through_g[l] = dot(C_c + l * Np, dCh.data() + l * Np, Np);
      through_w[l] = dot(B_c + l * Np, dBh.data() + l * Np, Np);
    }
    gemm(dCg, Np, dCg, 1.0f, Q.data(), L, 1, B_c, Np, L, Np, L);
    gemm(dBg, Np, dBg, 1.0f, Q.data(), 1, L, C_c, Np, L, Np, L);
    for (int64_t i = 0; i < L * Np; i += W) {
      store(dCg + i, load(dCg + i) + load(dCh.data() + i));
      store(dBg + i, load(dBg + i) + load(dBh.data() + i));
    }
    // through the whole chunk's decay, then dS for the chunk before: g_L dS + sum_l g_l dy_l C_l^T
    const float through_all = d.whole() * dot(dS, S, s.block());
    gemm(dS, Np, dS, d.whole(), gyg.data(), 1, Pp, C_c, Np, Pp, Np, L);
    float dlog[L];
    log_decay_grads(M.data(), Dyu.data(), through_g, through_w, through_all, dlog);
    for (int64_t k = 0; k < L && t0 + k < s.steps; ++k) {
      const int64_t t = t0 + k;
      const float *du_k = du.data() + k * Pp, *dy_k = gy.data() + k * Pp, *x_k = hc.xs.data() + k * Pp;
      for (int64_t p = 0; p < Pp; p += W) store(dx_row.data() + p, hc.dt[k] * load(du_k + p) + D_h * load(dy_k + p));
      std::memcpy(dx_p + ((b * s.steps + t) * s.heads + h) * s.P, dx_row.data(), s.P * sizeof(float));
      ddt_p[(b * s.steps + t) * s.heads + h] = dot(du_k, x_k, Pp) + dlog[k] * A_h;
      dA += dlog[k] * hc.dt[k];
      dD += dot(dy_k, x_k, Pp);
    }
  }
};

}  // namespace

// x [B, T, H, P], dt [B, T, H] (positive), A [H], Bm, Cm [B, T, G, N], D [H], S0 [B, H, P, N]
// -> y [B, T, H, P] (S_t C_t + D x_t) and last [B, H, P, N], the state after the last step
void ssd_forward(at::Tensor x, at::Tensor dt, at::Tensor A, at::Tensor Bm, at::Tensor Cm, at::Tensor D,
                 at::Tensor S0, at::Tensor y, at::Tensor last) {
  const Ssd s = sizes(x, dt, A, Bm, Cm, D, S0);
  check_out(y, {s.batch, s.steps, s.heads, s.P}, "y");
  check_out(last, S0.sizes(), "last");
  const View xv = view_of(x), dtv = view_of(dt), Bv = view_of(Bm), Cv = view_of(Cm);
  const float *A_p = A.data_ptr<float>(), *D_p = D.data_ptr<float>(), *S0_p = S0.data_ptr<float>();
  float *y_p = y.data_ptr<float>(), *last_p = last.data_ptr<float>();
  const int64_t Pp = s.Pp(), Np = s.Np(), PN = s.P * s.N, R = s.per_group(), block = s.block();
  // one (batch, group) at a time: its heads share the chunk's B, C and scores
  at::parallel_for(0, s.batch * s.groups, 1, [&](int64_t begin, int64_t end) {
    GroupChunk gc(s);
    HeadChunk hc(s);
    // each head's state as [Np, Pp]: row n holds column n of every row of S
    Lines S(block), ST(R * block), M(L * L), intra(L * Pp), readout(L * Pp), uw(L * Pp);
    for (int64_t bg = begin; bg < end; ++bg) {
      const int64_t b = bg / s.groups, g = bg % s.groups;
      for (int64_t r = 0; r < R; ++r) {
        state_in(s, S0_p + (b * s.heads + g * R + r) * PN, S.data());
        transpose(S.data(), Pp, Np, ST.data() + r * block);
      }
      for (int64_t t0 = 0; t0 < s.steps; t0 += L) {
        gc.fill(s, Bv, Cv, b, g, t0, true);
        for (int64_t r = 0; r < R; ++r) {
          const int64_t h = g * R + r;
          float* ST_h = ST.data() + r * block;
          hc.fill(s, xv, dtv, A_p[h], b, h, t0);
          const Decays d(hc.a);
          decayed(d, gc.Sc.data(), M.data());
          gemm(intra.data(), Pp, intra.data(), 0.0f, M.data(), L, 1, hc.u.data(), Pp, L, Pp, L);
          gemm(readout.data(), Pp, readout.data(), 0.0f, gc.Cs.data(), Np, 1, ST_h, Pp, L, Pp, Np);
          for (int64_t l = 0; l < L && t0 + l < s.steps; ++l) {
            float* y_t = y_p + ((b * s.steps + t0 + l) * s.heads + h) * s.P;
            for (int64_t p = 0; p < s.P; ++p)
              y_t[p] = intra[l * Pp + p] + d.g[l] * readout[l * Pp + p] + D_p[h] * hc.xs[l * Pp + p];
          }
          // ST = g_L ST + sum_s B_s (w_s u_s)^T
          scaled_rows(hc.u.data(), d.w(), Pp, uw.data());
          gemm(ST_h, Pp, ST_h, d.whole(), gc.Bs.data(), 1, Np, uw.data(), Pp, Np, Pp, L);
        }
      }
      for (int64_t r = 0; r < R; ++r) {
        transpose(ST.data() + r * block, Np, Pp, S.data());
        state_out(s, S.data(), last_p + (b * s.heads + g * R + r) * PN);
      }
    }
  });
}

// the forward's inputs, dy [B, T, H, P] and dlast [B, H, P, N] -> dx [B, T, H, P], ddt [B, T, H],
// dA and dD per batch row [B, H] (torch sums them), dB, dC [B, T, G, N] and dS0 [B, H, P, N]
void ssd_backward(at::Tensor x, at::Tensor dt, at::Tensor A, at::Tensor Bm, at::Tensor Cm, at::Tensor D,
                  at::Tensor S0, at::Tensor dy, at::Tensor dlast, at::Tensor dx, at::Tensor ddt, at::Tensor dA_part,
                  at::Tensor dD_part, at::Tensor dB, at::Tensor dC, at::Tensor dS0) {
  const Ssd s = sizes(x, dt, A, Bm, Cm, D, S0);
  check(dy, "dy", 4); check(dlast, "dlast", 4);
  TORCH_CHECK(dlast.is_contiguous(), "dlast: expected a contiguous tensor");
  check_out(dx, {s.batch, s.steps, s.heads, s.P}, "dx");
  check_out(ddt, {s.batch, s.steps, s.heads}, "ddt");
  check_out(dA_part, {s.batch, s.heads}, "dA_part");
  check_out(dD_part, {s.batch, s.heads}, "dD_part");
  check_out(dB, Bm.sizes(), "dB");
  check_out(dC, Bm.sizes(), "dC");
  check_out(dS0, S0.sizes(), "dS0");
  const int64_t Pp = s.Pp(), Np = s.Np(), PN = s.P * s.N, chunks = s.chunks(), block = s.block(), R = s.per_group();
  const View xv = view_of(x), dtv = view_of(dt), Bv = view_of(Bm), Cv = view_of(Cm), dyv = view_of(dy);
  const float *A_p = A.data_ptr<float>(), *D_p = D.data_ptr<float>(), *S0_p = S0.data_ptr<float>();
  const float* dlast_p = dlast.data_ptr<float>();
  float *dx_p = dx.data_ptr<float>(), *ddt_p = ddt.data_ptr<float>(), *dS0_p = dS0.data_ptr<float>();
  float *dA_p = dA_part.data_ptr<float>(), *dD_p = dD_part.data_ptr<float>();
  float *dB_p = dB.data_ptr<float>(), *dC_p = dC.data_ptr<float>();
  at::parallel_for(0, s.batch * s.groups, 1, [&](int64_t begin, int64_t end) {
    GroupChunk gc(s);
    HeadChunk hc(s);
    HeadBack back(s);
    // one head's state entering each chunk and its dS, as [Pp, Np] (S's own layout)
    Lines starts((chunks + 1) * block), dS(block), uw(L * Pp), dBg(L * Np), dCg(L * Np);
    for (int64_t bg = begin; bg < end; ++bg) {
      const int64_t b = bg / s.groups, g = bg % s.groups;
      // the group's heads in order, each walking all its chunks: a thread's scratch holds one head's
      // states, and dB and dC gain the heads' parts in the same order each run
      for (int64_t r = 0; r < R; ++r) {
        const int64_t h = g * R + r, bh = b * s.heads + h;
        auto start_of = [&](int64_t c) { return starts.data() + c * block; };
        state_in(s, S0_p + bh * PN, start_of(0));
        for (int64_t c = 0; c < chunks; ++c) {  // S = g_L S + sum_s (w_s u_s) B_s^T
          gc.fill(s, Bv, Cv, b, g, c * L, false);
          hc.fill(s, xv, dtv, A_p[h], b, h, c * L);
          const Decays d(hc.a);
          scaled_rows(hc.u.data(), d.w(), Pp, uw.data());
          gemm(start_of(c + 1), Np, start_of(c), d.whole(), uw.data(), 1, Pp, gc.Bs.data(), Np, Pp, Np, L);
        }
        state_in(s, dlast_p + bh * PN, dS.data());
        float dA = 0.0f, dD = 0.0f;
        for (int64_t c = chunks - 1; c >= 0; --c) {
          const int64_t t0 = c * L;
          gc.fill(s, Bv, Cv, b, g, t0, true);
          hc.fill(s, xv, dtv, A_p[h], b, h, t0);
          std::fill(dBg.data(), dBg.data() + L * Np, 0.0f);
          std::fill(dCg.data(), dCg.data() + L * Np, 0.0f);
          back.chunk(s, gc, hc, dyv, A_p[h], D_p[h], b, h, t0, start_of(c), dS.data(), dBg.data(), dCg.data(), dx_p,
                     ddt_p, dA, dD);
          for (int64_t k = 0; k < L && t0 + k < s.steps; ++k) {
            const int64_t at = ((b * s.steps + t0 + k) * s.groups + g) * s.N;
            rows_out(dBg.data() + k * Np, s.N, r > 0, dB_p + at);
            rows_out(dCg.data() + k * Np, s.N, r > 0, dC_p + at);
          }
        }
        state_out(s, dS.data(), dS0_p + bh * PN);
        dA_p[bh] = dA;
        dD_p[bh] = dD;
      }
    }
  });
}
"""


def _self_check(module) -> str | None:
    """Run the build on small odd shapes against the reference; None if forward and gradients agree."""
    from .naive import ssd_naive

    gen = torch.Generator().manual_seed(0)
    # two whole chunks and a ragged one; P 19 is a vector and a part of one, N 67 four vectors and a part
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
    """The scan with its skip: (x, dt, A, B, C, D, S0) -> (S_t C_t + D x_t [B, T, H, P], S_T [B, H, P, N])."""

    @staticmethod
    def forward(ctx, module, x, dt, A, B_BTGN, C_BTGN, D, S0):
        # outputs from torch.empty, so a test that fills new buffers with NaN sees any element left unwritten
        y, last = torch.empty(x.shape, dtype=torch.float32), torch.empty(S0.shape, dtype=torch.float32)
        module.ssd_forward(x, dt, A, B_BTGN, C_BTGN, D, S0, y, last)
        ctx.module = module
        ctx.save_for_backward(x, dt, A, B_BTGN, C_BTGN, D, S0)
        return y, last

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, dlast):
        x, dt, A, B_BTGN, C_BTGN, D, S0 = ctx.saved_tensors
        dx, ddt, dS0, dB, dC = (torch.empty(t.shape, dtype=torch.float32) for t in (x, dt, S0, B_BTGN, B_BTGN))
        dA_BH, dD_BH = (torch.empty(x.shape[0], x.shape[2], dtype=torch.float32) for _ in range(2))
        ctx.module.ssd_backward(*ctx.saved_tensors, _rows(dy), dlast.contiguous(), dx, ddt, dA_BH, dD_BH, dB, dC, dS0)
        return None, dx, ddt, dA_BH.sum(0), dB, dC, dD_BH.sum(0), dS0


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x in float32 with a contiguous last dim; a view into a wider tensor stays a view."""
    x = x.float()
    return x if x.stride(-1) == 1 else x.contiguous()


def _ssd(module, x, dt, A, B, C, D=None, *, initial_state=None, return_last_state=False):
    batch, _, heads, head_dim = x.shape
    if heads % B.shape[2]:
        raise ValueError(f"ssd: {heads} heads do not split evenly over {B.shape[2]} groups")
    if initial_state is None:
        S0_BHPN = x.new_zeros(batch, heads, head_dim, B.shape[-1], dtype=torch.float32)
    else:
        S0_BHPN = initial_state.float().contiguous()
    D_H = x.new_zeros(heads, dtype=torch.float32) if D is None else D.float().contiguous()
    y_BTHP, last_BHPN = _Ssd.apply(module, _rows(x), _rows(dt), A.float().contiguous(), _rows(B), _rows(C), D_H,
                                   S0_BHPN)
    y_BTHP = y_BTHP.to(x.dtype)
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
