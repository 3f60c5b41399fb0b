"""Mamba-2 SSD scan, C++ CPU kernel: the loop of naive.py compiled, 16 rows of the state at a time.

Same signature and return as `ssd_naive`; see tests/kernels/test_ssd_cpu.py. Dimensions: B batch,
T time, H heads, P head dim, G groups (head h reads group h // (H / G)), N state size.

Why a compiled loop. On a CPU the chunked PyTorch form (chunked.py) is bound by memory and by
the count of ops: per chunk it builds [B, H, L, L] decay masks, [B, H, P, N] chunk states and
their autograd graph, dozens of small tensors a step. The recurrence itself is 2 P N multiply-adds
a head and step, and the rows of the [P, N] state never meet: row p depends on x_t[p] alone.

    a_t = exp(dt_t A);   S_t = a_t S_{t-1} + (dt_t x_t) B_t^T;   y_t = S_t C_t

So the kernel walks one (batch, head) at a time (the pairs spread over torch's threads by
at::parallel_for), and within it a block of 16 rows (8 KiB at N = 128, in L1) through all T steps
before the next block. Rows are padded with zeros to whole vectors of 16 floats (`vec`: g++'s
vector type, one AVX-512 register). A step takes the block's columns four vectors at a time,
B_t's and C_t's four in registers, and walks the 16 rows under them; each row's readout is a vector
of partial sums, and the 16 rows' vectors are added across their lanes at once at the step's end
(`row_sums`, a transpose-and-add tree), so no row ends in a reduction of its own.

Backward, per (batch, head) and block: the forward is rerun, keeping the block's state at the start
of every `SPAN` steps, then each span backward from the last: the states before each of its steps
are recomputed from its start into a scratch (SPAN x 16 x N floats, 128 KiB at N = 128, in L2), and
walked backward carrying dS, again four vectors of columns under 16 rows at a time:

    g = dS + dy_t C_t^T;   du_t = g B_t;   dB_t += g^T u_t   (u_t = dt_t x_t)
    dC_t += a_t S_{t-1}^T dy_t + B_t <u_t, dy_t>   (that is S_t^T dy_t, without forming S_t)
    dx_t = dt_t du_t;   d dt_t = <du_t, x_t> + <g, S_{t-1}> a_t A;   dA += <g, S_{t-1}> a_t dt_t
    dS = a_t g

Seven multiply-adds a state element and step in the walk, two in each rerun. Against the form that
walked the whole [P, N] state a step at a time, one row's reduction after another, the forward
takes 0.75x and the backward 0.70x the time at B 8, T 256, H 4, P 64, N 128 (one thread, median of
9 interleaved calls, both built in one process).

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

using archsearch_cpu::Lines;
using archsearch_cpu::row_sums;

constexpr int64_t W = 16;  // floats in a vector
constexpr int64_t R = 16;  // rows of a head's state walked together (row_sums adds 16 at once)
// 16 floats: one AVX-512 register, two AVX2 ones (g++ splits the vector where the ISA's are shorter)
typedef float vec __attribute__((vector_size(64)));

inline vec load(const float* p) { vec v; std::memcpy(&v, p, sizeof v); return v; }  // no alignment asked
inline void store(float* p, vec v) { std::memcpy(p, &v, sizeof v); }
inline float lane_sum(vec v) { float s = 0.0f; for (int64_t i = 0; i < W; ++i) s += v[i]; return s; }

struct Ssd {  // sizes and the group of a head; x [B, T, H, P], dt [B, T, H], Bm, Cm [B, T, G, N]
  int64_t batch, steps, heads, P, groups, N;
  int64_t x_at(int64_t b, int64_t t, int64_t h) const { return ((b * steps + t) * heads + h) * P; }
  int64_t dt_at(int64_t b, int64_t t, int64_t h) const { return (b * steps + t) * heads + h; }
  int64_t bc_at(int64_t b, int64_t t, int64_t h) const {
    return ((b * steps + t) * groups + h / (heads / groups)) * N;
  }
  int64_t head_at(int64_t b, int64_t t, int64_t h) const { return ((b * steps + t) * heads + h) * N; }
  int64_t padded() const { return (N + W - 1) / W * W; }
  int64_t rows_in(int64_t r0) const { return std::min(R, P - r0); }  // rows of the block at r0 within P
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

// a_t = exp(dt_t A) of one (batch, head) over time
void decays_of(const Ssd& s, const float* dt_p, float A, int64_t b, int64_t h, float* a) {
  for (int64_t t = 0; t < s.steps; ++t) a[t] = std::exp(dt_p[s.dt_at(b, t, h)] * A);
}

// one (batch, head)'s B or C over time, rows padded with zeros to a whole number of vectors
void gather(const Ssd& s, const float* from, int64_t b, int64_t h, float* to) {
  const int64_t Np = s.padded();
  for (int64_t t = 0; t < s.steps; ++t) {
    std::memcpy(to + t * Np, from + s.bc_at(b, t, h), s.N * sizeof(float));
    std::fill(to + t * Np + s.N, to + (t + 1) * Np, 0.0f);
  }
}

// rows [r0, r0 + R) of a head's state in a padded block: S0's rows, zeros past P and N
void block_in(const Ssd& s, const float* S0_bh, int64_t r0, float* block) {
  const int64_t Np = s.padded();
  std::fill(block, block + R * Np, 0.0f);
  for (int64_t r = 0; r < s.rows_in(r0); ++r)
    std::memcpy(block + r * Np, S0_bh + (r0 + r) * s.N, s.N * sizeof(float));
}

// the block's rows back into a [P, N] state
void block_out(const Ssd& s, const float* block, int64_t r0, float* S_bh) {
  const int64_t Np = s.padded();
  for (int64_t r = 0; r < s.rows_in(r0); ++r)
    std::memcpy(S_bh + (r0 + r) * s.N, block + r * Np, s.N * sizeof(float));
}

struct Step {  // one step of a block: the decay and u = dt x of each row (0 past P)
  float dt, a;
  float u[R];
};

Step step_of(const Ssd& s, const float* x_p, const float* dt_p, const float* decays, int64_t b, int64_t t,
             int64_t h, int64_t r0) {
  Step st;
  st.dt = dt_p[s.dt_at(b, t, h)];
  st.a = decays[t];
  const float* x_t = x_p + s.x_at(b, t, h) + r0;
  const int64_t rows = s.rows_in(r0);
  for (int64_t r = 0; r < R; ++r) st.u[r] = r < rows ? st.dt * x_t[r] : 0.0f;
  return st;
}

// to = a from + u B^T over a block
inline void advance(const Step& st, const float* B_t, const float* from, float* to, int64_t Np) {
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < Np; c += W)
      store(to + r * Np + c, st.a * load(from + r * Np + c) + st.u[r] * load(B_t + c));
}

// one step of a block over vectors [c0, c0 + K W): S = a S + u B^T, and the rows' readouts S C
// added into acc (one vector of partial sums a row; the first chunk writes them)
template <int K>
inline void forward_chunk(const Step& st, const float* B_t, const float* C_t, float* S, float* acc, int64_t c0,
                          int64_t Np) {
  vec Bk[K], Ck[K];
  for (int k = 0; k < K; ++k) { Bk[k] = load(B_t + c0 + k * W); Ck[k] = load(C_t + c0 + k * W); }
  for (int64_t r = 0; r < R; ++r) {
    vec out = c0 == 0 ? vec{} : load(acc + r * W);
    for (int k = 0; k < K; ++k) {
      float* at = S + r * Np + c0 + k * W;
      const vec v = st.a * load(at) + st.u[r] * Bk[k];
      store(at, v);
      out += v * Ck[k];
    }
    store(acc + r * W, out);
  }
}

// the walk back over vectors [c0, c0 + K W) of one step of a block
template <int K>
inline void back_chunk(const Step& st, const float* gy, float ug, const float* B_t, const float* C_t,
                       const float* prev, float* G, float* dB_t, float* dC_t, float* du_part, vec* dec, int64_t c0,
                       int64_t Np) {
  vec Bk[K], Ck[K], dBk[K], dCk[K];
  for (int k = 0; k < K; ++k) {
    Bk[k] = load(B_t + c0 + k * W); Ck[k] = load(C_t + c0 + k * W);
    dBk[k] = load(dB_t + c0 + k * W); dCk[k] = vec{};
  }
  for (int64_t r = 0; r < R; ++r) {
    const float gr = gy[r], ur = st.u[r];
    vec du = {};
    for (int k = 0; k < K; ++k) {
      const int64_t at = r * Np + c0 + k * W;
      const vec p = load(prev + at), g = load(G + at) + gr * Ck[k];  // dL/dS_t
      dCk[k] += gr * p;
      du += g * Bk[k];
      dBk[k] += g * ur;
      dec[k] += g * p;
      store(G + at, st.a * g);
    }
    store(du_part + r * W, load(du_part + r * W) + du);
  }
  // S_t^T dy_t = a S_{t-1}^T dy_t + B_t (u_t . dy_t)
  for (int k = 0; k < K; ++k) {
    store(dB_t + c0 + k * W, dBk[k]);
    store(dC_t + c0 + k * W, load(dC_t + c0 + k * W) + st.a * dCk[k] + ug * Bk[k]);
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
  const int64_t Np = s.padded(), PN = s.P * s.N;
  at::parallel_for(0, s.batch * s.heads, 1, [&](int64_t begin, int64_t end) {
    Lines Bt(s.steps * Np), Ct(s.steps * Np), S(R * Np), acc(R * W);
    std::vector<float> decays(s.steps);
    float sums[R];
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / s.heads, h = bh % s.heads;
      decays_of(s, dt_p, A_p[h], b, h, decays.data());
      gather(s, B_p, b, h, Bt.data());
      gather(s, C_p, b, h, Ct.data());
      for (int64_t r0 = 0; r0 < s.P; r0 += R) {
        const int64_t rows = s.rows_in(r0);
        block_in(s, S0_p + bh * PN, r0, S.data());
        for (int64_t t = 0; t < s.steps; ++t) {
          const Step st = step_of(s, x_p, dt_p, decays.data(), b, t, h, r0);
          const float *B_t = Bt.data() + t * Np, *C_t = Ct.data() + t * Np;
          int64_t c0 = 0;
          for (; c0 + 4 * W <= Np; c0 += 4 * W) forward_chunk<4>(st, B_t, C_t, S.data(), acc.data(), c0, Np);
          for (; c0 < Np; c0 += W) forward_chunk<1>(st, B_t, C_t, S.data(), acc.data(), c0, Np);
          row_sums(acc.data(), R, sums);
          std::memcpy(y_p + s.x_at(b, t, h) + r0, sums, rows * sizeof(float));
        }
        block_out(s, S.data(), r0, last_p + bh * PN);
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
  const int64_t N = s.N, Np = s.padded(), PN = s.P * N, block = R * Np;
  const int64_t spans = std::max<int64_t>(1, (s.steps + span - 1) / span);
  at::Tensor dx = at::empty_like(x), ddt = at::empty_like(dt), dS0 = at::empty_like(S0);
  at::Tensor dA_part = at::empty({s.batch, s.heads}, x.options());
  at::Tensor dB = at::empty({s.batch, s.steps, s.heads, N}, x.options()), dC = at::empty_like(dB);
  const float *x_p = x.data_ptr<float>(), *dt_p = dt.data_ptr<float>(), *A_p = A.data_ptr<float>();
  const float *B_p = Bm.data_ptr<float>(), *C_p = Cm.data_ptr<float>(), *S0_p = S0.data_ptr<float>();
  const float *dy_p = dy.data_ptr<float>(), *dlast_p = dlast.data_ptr<float>();
  float *dx_p = dx.data_ptr<float>(), *ddt_p = ddt.data_ptr<float>(), *dS0_p = dS0.data_ptr<float>();
  float *dA_p = dA_part.data_ptr<float>(), *dB_p = dB.data_ptr<float>(), *dC_p = dC.data_ptr<float>();
  at::parallel_for(0, s.batch * s.heads, 1, [&](int64_t begin, int64_t end) {
    Lines Bt(s.steps * Np), Ct(s.steps * Np), dBt(s.steps * Np), dCt(s.steps * Np);
    Lines starts(spans * block), run(span * block), G(block), du_part(R * W);
    std::vector<float> ddt_sum(s.steps), decays(s.steps);
    float du[R];
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / s.heads, h = bh % s.heads;
      const float A_h = A_p[h];
      decays_of(s, dt_p, A_h, b, h, decays.data());
      gather(s, B_p, b, h, Bt.data());
      gather(s, C_p, b, h, Ct.data());
      std::fill(dBt.data(), dBt.data() + s.steps * Np, 0.0f);
      std::fill(dCt.data(), dCt.data() + s.steps * Np, 0.0f);
      std::fill(ddt_sum.begin(), ddt_sum.end(), 0.0f);
      float dA = 0.0f;
      for (int64_t r0 = 0; r0 < s.P; r0 += R) {
        const int64_t rows = s.rows_in(r0);
        block_in(s, S0_p + bh * PN, r0, starts.data());
        for (int64_t j = 1; j < spans; ++j) {
          float* at = starts.data() + j * block;
          for (int64_t t = (j - 1) * span; t < j * span; ++t)
            advance(step_of(s, x_p, dt_p, decays.data(), b, t, h, r0), Bt.data() + t * Np,
                    t == (j - 1) * span ? at - block : at, at, Np);
        }
        block_in(s, dlast_p + bh * PN, r0, G.data());
        for (int64_t j = spans - 1; j >= 0; --j) {
          const int64_t t0 = j * span, t1 = std::min(s.steps, t0 + span);
          // the state before step t: the span's start at t0, else run[t - t0 - 1]
          const float* start = starts.data() + j * block;
          auto before = [&](int64_t t) { return t == t0 ? start : run.data() + (t - t0 - 1) * block; };
          for (int64_t t = t0; t + 1 < t1; ++t)
            advance(step_of(s, x_p, dt_p, decays.data(), b, t, h, r0), Bt.data() + t * Np, before(t),
                    run.data() + (t - t0) * block, Np);
          for (int64_t t = t1 - 1; t >= t0; --t) {
            const Step st = step_of(s, x_p, dt_p, decays.data(), b, t, h, r0);
            float gy[R];
            const float* dy_t = dy_p + s.x_at(b, t, h) + r0;
            float ug = 0.0f;
            for (int64_t r = 0; r < R; ++r) { gy[r] = r < rows ? dy_t[r] : 0.0f; ug += st.u[r] * gy[r]; }
            const float *B_t = Bt.data() + t * Np, *C_t = Ct.data() + t * Np, *prev = before(t);
            float *dB_t = dBt.data() + t * Np, *dC_t = dCt.data() + t * Np;
            std::fill(du_part.data(), du_part.data() + R * W, 0.0f);
            vec dec[4] = {};
            int64_t c0 = 0;
            for (; c0 + 4 * W <= Np; c0 += 4 * W)
              back_chunk<4>(st, gy, ug, B_t, C_t, prev, G.data(), dB_t, dC_t, du_part.data(), dec, c0, Np);
            for (; c0 < Np; c0 += W)
              back_chunk<1>(st, gy, ug, B_t, C_t, prev, G.data(), dB_t, dC_t, du_part.data(), dec, c0, Np);
            row_sums(du_part.data(), R, du);
            const float* x_t = x_p + s.x_at(b, t, h) + r0;
            float* dx_t = dx_p + s.x_at(b, t, h) + r0;
            float through_u = 0.0f;
            for (int64_t r = 0; r < rows; ++r) { dx_t[r] = st.dt * du[r]; through_u += du[r] * x_t[r]; }
            const float decay = lane_sum((dec[0] + dec[1]) + (dec[2] + dec[3]));
            ddt_sum[t] += through_u + decay * st.a * A_h;
            dA += decay * st.a * st.dt;
          }
        }
        block_out(s, G.data(), r0, dS0_p + bh * PN);
      }
      for (int64_t t = 0; t < s.steps; ++t) {
        ddt_p[s.dt_at(b, t, h)] = ddt_sum[t];
        std::memcpy(dB_p + s.head_at(b, t, h), dBt.data() + t * Np, N * sizeof(float));
        std::memcpy(dC_p + s.head_at(b, t, h), dCt.data() + t * Np, N * sizeof(float));
      }
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
    # P 19: a whole block of rows and a part of one; N 67: a chunk of four vectors, one of a part
    b, t, h, g, p, n = 2, SPAN + 3, 4, 2, 19, 67
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
