"""Gated delta rule (Gated DeltaNet), C++ CPU kernel: the loop of naive.py compiled, the state in cache.

Same signature and return as `gated_delta_rule_naive`; see tests/kernels/test_gated_delta_cpu.py.
Dimensions: B batch, T time, H heads, K key dim, V value dim.

Why a compiled loop. On a CPU the chunked WY form (chunked.py) spends its time in many small
ops: per chunk [L, L] masks and decays, a triangular solve, the state loop's matmuls and their
copies, a few hundred ops a layer and step. The recurrence itself is a few K V multiply-adds a
head and step, and a Gated DeltaNet head is small (K = V = 16 at d 128). This kernel walks
t = 0..T-1 for one (batch, head) at a time with the [K, V] state (S transposed, naive.py's
layout) in L1, vectorised over V, the (batch, head) pairs spread over torch's threads:

    r = S^T k;   w = beta (v - a r);   S <- a S + k w^T;   o = S^T q        (a = exp(g))

Backward, per (batch, head): the forward is rerun keeping the state at the start of every
`SPAN` steps; each span, from the last, is recomputed from its start, keeping the state before
each step and the step's r and w, then walked back carrying dS (the gradient of the state after
the step):

    dS += q do^T;   dq = S_t do;   dw = dS^T k;   dk = dS w + a S_{t-1} dr
    dv = beta dw;   dbeta = <dw, v - a r>;   dr = -beta dw
    dg = a (<dS, S_{t-1}> + <dr, r>);   dS <- a (dS + k dr^T)

where S_t = a S_{t-1} + k w^T is formed again from S_{t-1} as the walk needs it. About 2.3x less
CPU than the chunked form at B 8, T 256, H 8, K = V = 16, forward and backward, one thread.

Two walks run these formulas. The row walk above vectorises over V within one (batch, head), so
each step's sums over V (dq, dk and the decay's gradient, per row of the state) end in a
reduction across a vector's lanes; at V = 16 a row is one vector and those reductions are most of
the backward. The lane walk (`lanes` below) takes 16 (batch, head) pairs side by side, one per
vector lane, so every sum is a per-lane multiply-add; its inputs are copied into that layout a
span at a time, and every scratch is aligned to a cache line. It runs where a head's state is
small and the pairs fill a group of lanes (`by_lanes`). Forward and backward at B 8, T 256, one
thread, against the row walk (`benchmarks/bench_scan.py --walks`, two runs): 0.51x-0.57x the time
at H 8, K = V = 16, 0.69x-0.75x at H 4, K = V = 32, 0.88x-1.04x at 48 and 1.08x-1.16x at 64,
where the row walk is left to run.

Building: `RULE` (archsearch_kernels/cpu_build.py) compiles the source below on first use, once per
Python environment, and checks it against the reference on small odd shapes. If it does not
compile or does not agree, `available()` is False, the reason is in `build_error()`, and dispatch
falls back to the chunked PyTorch form (archsearch_kernels/dispatch.py).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from ..cpu_build import Extension, compare_scans

# steps between the states the backward keeps; a span's states stay in L1 or L2
SPAN = 16
# the lane walk: (batch, head) pairs per group (the C++ `lanes::L`), and the largest head state
# K V it takes (its [K, V, LANES] state is 64 KiB at K = V = 32; at 48 the two walks are level,
# from 64 the row walk's vectors over V are long and it is the faster)
LANES = 16
LANE_STATE_MAX = 32 * 32


def by_lanes(batch: int, heads: int, key_dim: int, value_dim: int) -> bool:
    """Whether the lane walk runs: small heads, and pairs to fill a group of lanes at least."""
    return key_dim * value_dim <= LANE_STATE_MAX and batch * heads >= LANES

SOURCE = r"""
namespace {

struct Rule {  // sizes; q, k [B, T, H, K], v [B, T, H, V], g, beta [B, T, H], states [B, H, K, V]
  int64_t batch, steps, heads, K, V;
  int64_t k_at(int64_t b, int64_t t, int64_t h) const { return ((b * steps + t) * heads + h) * K; }
  int64_t v_at(int64_t b, int64_t t, int64_t h) const { return ((b * steps + t) * heads + h) * V; }
  int64_t g_at(int64_t b, int64_t t, int64_t h) const { return (b * steps + t) * heads + h; }
};

void check(const at::Tensor& x, const char* name, int64_t dim) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.device().is_cpu() && x.dim() == dim && x.is_contiguous(),
              name, ": expected a contiguous float32 CPU tensor of ", dim, " dims");
}

Rule sizes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
           const at::Tensor& beta, const at::Tensor& S0) {
  check(q, "q", 4); check(k, "k", 4); check(v, "v", 4); check(g, "g", 3); check(beta, "beta", 3);
  check(S0, "initial_state", 4);
  TORCH_CHECK(k.sizes() == q.sizes(), "k must have q's shape");
  return Rule{q.size(0), q.size(1), q.size(2), q.size(3), v.size(3)};
}

// one step: r = S^T k for the state S before it (what the memory recalls for k), w = beta (v - a r)
// (what it writes), and, where `to` is given, the state after it, to = a S + k w^T (to may be
// `from`), with o = to^T q where `o` is given
inline void step(int64_t K, int64_t V, float a, float beta, const float* q_t, const float* k_t, const float* v_t,
                 const float* from, float* to, float* r, float* w, float* o) {
#pragma omp simd
  for (int64_t x = 0; x < V; ++x) r[x] = 0.0f;
  for (int64_t y = 0; y < K; ++y) {
    const float ky = k_t[y];
    const float* row = from + y * V;
#pragma omp simd
    for (int64_t x = 0; x < V; ++x) r[x] += ky * row[x];
  }
#pragma omp simd
  for (int64_t x = 0; x < V; ++x) w[x] = beta * (v_t[x] - a * r[x]);
  if (!to) return;
  if (o) {
#pragma omp simd
    for (int64_t x = 0; x < V; ++x) o[x] = 0.0f;
  }
  for (int64_t y = 0; y < K; ++y) {
    const float ky = k_t[y], qy = o ? q_t[y] : 0.0f;
    const float* row = from + y * V;
    float* out = to + y * V;
#pragma omp simd
    for (int64_t x = 0; x < V; ++x) {
      const float next = a * row[x] + ky * w[x];
      out[x] = next;
      if (o) o[x] += qy * next;
    }
  }
}

}  // namespace

// The lane walk: L (batch, head) pairs side by side, one per vector lane, every array lane-minor
// ([K][V][L] states, [K][L] and [V][L] vectors, pair j L + l in lane l). Each op of the recurrence
// is then a lane-wise multiply-add, and the sums over a head's rows (dq, dk, the decay's
// gradient), which the row walk reduces across the lanes of a vector at every step, are per-lane
// accumulations. Inputs are copied into this layout a span at a time and gradients copied back.
namespace lanes {

using archsearch_cpu::Lines;

constexpr int64_t L = 16;

int64_t groups(const Rule& s) { return (s.batch * s.heads + L - 1) / L; }

// rows [t0, t1) of a [B, T, H, D] tensor (a [B, H, D] one with T = 1) for the pairs of group j
// into out[((t - t0) D + d) L + l]; lanes past the last pair get 0, which the recurrence keeps at 0
void pack(const Rule& s, const float* src, int64_t D, int64_t T, int64_t j, int64_t t0, int64_t t1, float* out) {
  for (int64_t l = 0; l < L; ++l) {
    const int64_t bh = j * L + l;
    if (bh >= s.batch * s.heads) {
      for (int64_t i = 0; i < (t1 - t0) * D; ++i) out[i * L + l] = 0.0f;
      continue;
    }
    const int64_t b = bh / s.heads, h = bh % s.heads;
    for (int64_t t = t0; t < t1; ++t) {
      const float* row = src + ((b * T + t) * s.heads + h) * D;
      float* o = out + (t - t0) * D * L + l;
      for (int64_t d = 0; d < D; ++d) o[d * L] = row[d];
    }
  }
}

// pack's inverse, for the pairs that exist
void unpack(const Rule& s, const float* in, int64_t D, int64_t T, int64_t j, int64_t t0, int64_t t1, float* dst) {
  for (int64_t l = 0; l < L && j * L + l < s.batch * s.heads; ++l) {
    const int64_t bh = j * L + l, b = bh / s.heads, h = bh % s.heads;
    for (int64_t t = t0; t < t1; ++t) {
      float* row = dst + ((b * T + t) * s.heads + h) * D;
      const float* i = in + (t - t0) * D * L + l;
      for (int64_t d = 0; d < D; ++d) row[d] = i[d * L];
    }
  }
}

struct Span {  // one group's inputs for the steps [t0, t1), lane-minor, with a = exp(g)
  Lines q, k, v, a, beta;
  Span(int64_t span, int64_t K, int64_t V) : q(span * K * L), k(span * K * L), v(span * V * L), a(span * L), beta(span * L) {}
  void load(const Rule& s, const float* q_p, const float* k_p, const float* v_p, const float* g_p, const float* b_p,
            int64_t j, int64_t t0, int64_t t1) {
    if (q_p) pack(s, q_p, s.K, s.steps, j, t0, t1, q.data());
    pack(s, k_p, s.K, s.steps, j, t0, t1, k.data());
    pack(s, v_p, s.V, s.steps, j, t0, t1, v.data());
    pack(s, g_p, 1, s.steps, j, t0, t1, a.data());
    pack(s, b_p, 1, s.steps, j, t0, t1, beta.data());
    float* a_p = a.data();
#pragma omp simd
    for (int64_t i = 0; i < (t1 - t0) * L; ++i) a_p[i] = archsearch_cpu::exp_lane(a_p[i]);
  }
};

// the row walk's `step` for L pairs: r = S^T k, w = beta (v - a r), to = a S + k w^T (to may be
// S) where given, o = to^T q where given
inline void step(int64_t K, int64_t V, const float* a, const float* beta, const float* q, const float* k,
                 const float* v, const float* S, float* to, float* r, float* w, float* o) {
  for (int64_t x = 0; x < V; ++x) {
    alignas(64) float acc[L] = {};
    for (int64_t y = 0; y < K; ++y) {
      const float *ky = k + y * L, *s = S + (y * V + x) * L;
#pragma omp simd
      for (int64_t l = 0; l < L; ++l) acc[l] += ky[l] * s[l];
    }
#pragma omp simd
    for (int64_t l = 0; l < L; ++l) {
      r[x * L + l] = acc[l];
      w[x * L + l] = beta[l] * (v[x * L + l] - a[l] * acc[l]);
    }
  }
  if (!to) return;
  if (o) std::fill(o, o + V * L, 0.0f);
  for (int64_t y = 0; y < K; ++y) {
    const float *ky = k + y * L, *qy = q + y * L;
    for (int64_t x = 0; x < V; ++x) {
      const float *s = S + (y * V + x) * L, *wx = w + x * L;
      float* out = to + (y * V + x) * L;
      if (o) {
        float* ox = o + x * L;
#pragma omp simd
        for (int64_t l = 0; l < L; ++l) {
          const float next = a[l] * s[l] + ky[l] * wx[l];
          out[l] = next;
          ox[l] += qy[l] * next;
        }
      } else {
#pragma omp simd
        for (int64_t l = 0; l < L; ++l) out[l] = a[l] * s[l] + ky[l] * wx[l];
      }
    }
  }
}

void forward(const Rule& s, const float* q_p, const float* k_p, const float* v_p, const float* g_p, const float* b_p,
             const float* S0_p, float* o_p, float* last_p, int64_t span) {
  const int64_t K = s.K, V = s.V, KV = K * V;
  at::parallel_for(0, groups(s), 1, [&](int64_t begin, int64_t end) {
    Span in(span, K, V);
    Lines S(KV * L), r(V * L), w(V * L), out(span * V * L);
    for (int64_t j = begin; j < end; ++j) {
      pack(s, S0_p, KV, 1, j, 0, 1, S.data());
      for (int64_t t0 = 0; t0 < s.steps; t0 += span) {
        const int64_t t1 = std::min(s.steps, t0 + span);
        in.load(s, q_p, k_p, v_p, g_p, b_p, j, t0, t1);
        for (int64_t i = 0; i < t1 - t0; ++i)
          step(K, V, in.a.data() + i * L, in.beta.data() + i * L, in.q.data() + i * K * L, in.k.data() + i * K * L,
               in.v.data() + i * V * L, S.data(), S.data(), r.data(), w.data(), out.data() + i * V * L);
        unpack(s, out.data(), V, s.steps, j, t0, t1, o_p);
      }
      unpack(s, S.data(), KV, 1, j, 0, 1, last_p);
    }
  });
}

// the row walk's backward, L pairs at a time (same spans, same formulas)
void backward(const Rule& s, const float* q_p, const float* k_p, const float* v_p, const float* g_p,
              const float* b_p, const float* S0_p, const float* do_p, const float* dlast_p, float* dq_p, float* dk_p,
              float* dv_p, float* dg_p, float* db_p, float* dS0_p, int64_t span) {
  const int64_t K = s.K, V = s.V, KV = K * V, spans = std::max<int64_t>(1, (s.steps + span - 1) / span);
  at::parallel_for(0, groups(s), 1, [&](int64_t begin, int64_t end) {
    Span in(span, K, V);
    Lines starts(spans * KV * L), run(span * KV * L), recalls(span * V * L), writes(span * V * L);
    Lines dS(KV * L), dO(span * V * L), dQ(span * K * L), dK(span * K * L), dV(span * V * L);
    Lines dG(span * L), dBeta(span * L), dw(V * L), dr(V * L), scratch(2 * V * L);
    for (int64_t j = begin; j < end; ++j) {
      pack(s, S0_p, KV, 1, j, 0, 1, starts.data());
      for (int64_t sp = 1; sp < spans; ++sp) {
        float* S = starts.data() + sp * KV * L;
        std::memcpy(S, S - KV * L, KV * L * sizeof(float));
        in.load(s, nullptr, k_p, v_p, g_p, b_p, j, (sp - 1) * span, sp * span);
        for (int64_t i = 0; i < span; ++i)
          step(K, V, in.a.data() + i * L, in.beta.data() + i * L, nullptr, in.k.data() + i * K * L,
               in.v.data() + i * V * L, S, S, scratch.data(), scratch.data() + V * L, nullptr);
      }
      pack(s, dlast_p, KV, 1, j, 0, 1, dS.data());
      for (int64_t sp = spans - 1; sp >= 0; --sp) {
        const int64_t t0 = sp * span, t1 = std::min(s.steps, t0 + span), n = t1 - t0;
        in.load(s, q_p, k_p, v_p, g_p, b_p, j, t0, t1);
        pack(s, do_p, V, s.steps, j, t0, t1, dO.data());
        std::memcpy(run.data(), starts.data() + sp * KV * L, KV * L * sizeof(float));
        for (int64_t i = 0; i < n; ++i)
          step(K, V, in.a.data() + i * L, in.beta.data() + i * L, nullptr, in.k.data() + i * K * L,
               in.v.data() + i * V * L, run.data() + i * KV * L, i + 1 < n ? run.data() + (i + 1) * KV * L : nullptr,
               recalls.data() + i * V * L, writes.data() + i * V * L, nullptr);
        for (int64_t i = n - 1; i >= 0; --i) {
          const float *a = in.a.data() + i * L, *bt = in.beta.data() + i * L;
          const float *q_t = in.q.data() + i * K * L, *k_t = in.k.data() + i * K * L, *v_t = in.v.data() + i * V * L;
          const float *do_t = dO.data() + i * V * L, *prev = run.data() + i * KV * L;
          const float *r = recalls.data() + i * V * L, *w = writes.data() + i * V * L;
          float *dq_t = dQ.data() + i * K * L, *dk_t = dK.data() + i * K * L, *dv_t = dV.data() + i * V * L;
          alignas(64) float da[L] = {}, dbt[L] = {};
          std::fill(dw.data(), dw.data() + V * L, 0.0f);
          for (int64_t y = 0; y < K; ++y) {  // dS_t = dS + q do^T; dq = S_t do; dw = dS_t^T k; dk = dS_t w
            const float *qy = q_t + y * L, *ky = k_t + y * L;
            alignas(64) float dq_acc[L] = {}, dk_acc[L] = {};
            for (int64_t x = 0; x < V; ++x) {
              const float *p = prev + (y * V + x) * L, *wx = w + x * L, *dox = do_t + x * L;
              float *gx = dS.data() + (y * V + x) * L, *dwx = dw.data() + x * L;
#pragma omp simd
              for (int64_t l = 0; l < L; ++l) {
                const float st = a[l] * p[l] + ky[l] * wx[l], gs = gx[l] + qy[l] * dox[l];
                gx[l] = gs;
                dq_acc[l] += st * dox[l];
                dwx[l] += gs * ky[l];
                dk_acc[l] += gs * wx[l];
                da[l] += gs * p[l];
              }
            }
#pragma omp simd
            for (int64_t l = 0; l < L; ++l) {
              dq_t[y * L + l] = dq_acc[l];
              dk_t[y * L + l] = dk_acc[l];
            }
          }
          for (int64_t x = 0; x < V; ++x) {  // dv = beta dw, dbeta = <dw, v - a r>, dr = -beta dw
#pragma omp simd
            for (int64_t l = 0; l < L; ++l) {
              const float d = dw[x * L + l];
              dv_t[x * L + l] = bt[l] * d;
              dbt[l] += d * (v_t[x * L + l] - a[l] * r[x * L + l]);
              dr[x * L + l] = -bt[l] * d;
              da[l] += dr[x * L + l] * r[x * L + l];
            }
          }
          for (int64_t y = 0; y < K; ++y) {  // dk += a S_{t-1} dr; dS_{t-1} = a (dS_t + k dr^T)
            const float* ky = k_t + y * L;
            alignas(64) float acc[L] = {};
            for (int64_t x = 0; x < V; ++x) {
              const float *p = prev + (y * V + x) * L, *drx = dr.data() + x * L;
              float* gx = dS.data() + (y * V + x) * L;
#pragma omp simd
              for (int64_t l = 0; l < L; ++l) {
                acc[l] += p[l] * drx[l];
                gx[l] = a[l] * (gx[l] + ky[l] * drx[l]);
              }
            }
#pragma omp simd
            for (int64_t l = 0; l < L; ++l) dk_t[y * L + l] += a[l] * acc[l];
          }
#pragma omp simd
          for (int64_t l = 0; l < L; ++l) {
            dBeta[i * L + l] = dbt[l];
            dG[i * L + l] = da[l] * a[l];
          }
        }
        unpack(s, dQ.data(), K, s.steps, j, t0, t1, dq_p);
        unpack(s, dK.data(), K, s.steps, j, t0, t1, dk_p);
        unpack(s, dV.data(), V, s.steps, j, t0, t1, dv_p);
        unpack(s, dG.data(), 1, s.steps, j, t0, t1, dg_p);
        unpack(s, dBeta.data(), 1, s.steps, j, t0, t1, db_p);
      }
      unpack(s, dS.data(), KV, 1, j, 0, 1, dS0_p);
    }
  });
}

}  // namespace lanes

// q, k [B, T, H, K], v [B, T, H, V], g, beta [B, T, H], S0 [B, H, K, V] -> o [B, T, H, V], last [B, H, K, V]
std::vector<at::Tensor> rule_forward(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor g, at::Tensor beta,
                                     at::Tensor S0, int64_t span, bool by_lanes) {
  const Rule s = sizes(q, k, v, g, beta, S0);
  at::Tensor o = at::empty_like(v), last = at::empty_like(S0);
  const float *q_p = q.data_ptr<float>(), *k_p = k.data_ptr<float>(), *v_p = v.data_ptr<float>();
  const float *g_p = g.data_ptr<float>(), *b_p = beta.data_ptr<float>(), *S0_p = S0.data_ptr<float>();
  float *o_p = o.data_ptr<float>(), *last_p = last.data_ptr<float>();
  if (by_lanes) {
    lanes::forward(s, q_p, k_p, v_p, g_p, b_p, S0_p, o_p, last_p, span);
    return {o, last};
  }
  const int64_t KV = s.K * s.V;
  at::parallel_for(0, s.batch * s.heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch(2 * s.V);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / s.heads, h = bh % s.heads;
      float* S = last_p + bh * KV;  // the state lives in its output
      std::memcpy(S, S0_p + bh * KV, KV * sizeof(float));
      for (int64_t t = 0; t < s.steps; ++t) {
        step(s.K, s.V, std::exp(g_p[s.g_at(b, t, h)]), b_p[s.g_at(b, t, h)], q_p + s.k_at(b, t, h),
             k_p + s.k_at(b, t, h), v_p + s.v_at(b, t, h), S, S, scratch.data(), scratch.data() + s.V,
             o_p + s.v_at(b, t, h));
      }
    }
  });
  return {o, last};
}

// the forward's inputs, do [B, T, H, V] and dlast [B, H, K, V]
// -> dq, dk [B, T, H, K], dv [B, T, H, V], dg, dbeta [B, T, H], dS0 [B, H, K, V]
std::vector<at::Tensor> rule_backward(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor g, at::Tensor beta,
                                      at::Tensor S0, at::Tensor dout, at::Tensor dlast, int64_t span,
                                      bool by_lanes) {
  const Rule s = sizes(q, k, v, g, beta, S0);
  check(dout, "do", 4); check(dlast, "dlast", 4);
  // at T = 0 one empty span, so the buffers below hold a state
  const int64_t K = s.K, V = s.V, KV = K * V, spans = std::max<int64_t>(1, (s.steps + span - 1) / span);
  at::Tensor dq = at::empty_like(q), dk = at::empty_like(k), dv = at::empty_like(v);
  at::Tensor dg = at::empty_like(g), dbeta = at::empty_like(beta), dS0 = at::empty_like(S0);
  const float *q_p = q.data_ptr<float>(), *k_p = k.data_ptr<float>(), *v_p = v.data_ptr<float>();
  const float *g_p = g.data_ptr<float>(), *b_p = beta.data_ptr<float>(), *S0_p = S0.data_ptr<float>();
  const float *do_p = dout.data_ptr<float>(), *dlast_p = dlast.data_ptr<float>();
  float *dq_p = dq.data_ptr<float>(), *dk_p = dk.data_ptr<float>(), *dv_p = dv.data_ptr<float>();
  float *dg_p = dg.data_ptr<float>(), *db_p = dbeta.data_ptr<float>(), *dS0_p = dS0.data_ptr<float>();
  if (by_lanes) {
    lanes::backward(s, q_p, k_p, v_p, g_p, b_p, S0_p, do_p, dlast_p, dq_p, dk_p, dv_p, dg_p, db_p, dS0_p, span);
    return {dq, dk, dv, dg, dbeta, dS0};
  }
  at::parallel_for(0, s.batch * s.heads, 1, [&](int64_t begin, int64_t end) {
    // starts[j]: the state before span j; run[i]: the state before step t0 + i of the span in hand,
    // with the r and w that step computed (recalls[i], writes[i])
    std::vector<float> starts(spans * KV), run(span * KV), recalls(span * V), writes(span * V), carry(KV);
    std::vector<float> scratch(2 * V), dw(V), dr(V);
    float* dS = carry.data();
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / s.heads, h = bh % s.heads;
      std::memcpy(starts.data(), S0_p + bh * KV, KV * sizeof(float));
      for (int64_t j = 1; j < spans; ++j) {
        float* S = starts.data() + j * KV;
        std::memcpy(S, S - KV, KV * sizeof(float));
        for (int64_t t = (j - 1) * span; t < j * span; ++t)
          step(K, V, std::exp(g_p[s.g_at(b, t, h)]), b_p[s.g_at(b, t, h)], nullptr, k_p + s.k_at(b, t, h),
               v_p + s.v_at(b, t, h), S, S, scratch.data(), scratch.data() + V, nullptr);
      }
      std::memcpy(dS, dlast_p + bh * KV, KV * sizeof(float));
      for (int64_t j = spans - 1; j >= 0; --j) {
        const int64_t t0 = j * span, t1 = std::min(s.steps, t0 + span);
        std::memcpy(run.data(), starts.data() + j * KV, KV * sizeof(float));
        for (int64_t t = t0; t < t1; ++t) {  // r, w of every step, the state before each but the first
          const int64_t i = t - t0;
          step(K, V, std::exp(g_p[s.g_at(b, t, h)]), b_p[s.g_at(b, t, h)], nullptr, k_p + s.k_at(b, t, h),
               v_p + s.v_at(b, t, h), run.data() + i * KV, t + 1 < t1 ? run.data() + (i + 1) * KV : nullptr,
               recalls.data() + i * V, writes.data() + i * V, nullptr);
        }
        for (int64_t t = t1 - 1; t >= t0; --t) {
          const int64_t i = t - t0;
          const float a = std::exp(g_p[s.g_at(b, t, h)]), bt = b_p[s.g_at(b, t, h)];
          const float *q_t = q_p + s.k_at(b, t, h), *k_t = k_p + s.k_at(b, t, h), *v_t = v_p + s.v_at(b, t, h);
          const float *do_t = do_p + s.v_at(b, t, h), *prev = run.data() + i * KV;
          const float *r = recalls.data() + i * V, *w = writes.data() + i * V;
          float *dq_t = dq_p + s.k_at(b, t, h), *dk_t = dk_p + s.k_at(b, t, h), *dv_t = dv_p + s.v_at(b, t, h);
          float da = 0.0f;
          for (int64_t x = 0; x < V; ++x) dw[x] = 0.0f;
          for (int64_t y = 0; y < K; ++y) {  // dS_t = dS + q do^T; dq = S_t do; dw = dS_t^T k; dk = dS_t w
            const float qy = q_t[y], ky = k_t[y];
            const float* p_row = prev + y * V;
            float* g_row = dS + y * V;
            float dq_acc = 0.0f, dk_acc = 0.0f, da_acc = 0.0f;
#pragma omp simd reduction(+ : dq_acc, dk_acc, da_acc)
            for (int64_t x = 0; x < V; ++x) {
              const float st = a * p_row[x] + ky * w[x], gs = g_row[x] + qy * do_t[x];
              g_row[x] = gs;
              dq_acc += st * do_t[x];
              dw[x] += gs * ky;
              dk_acc += gs * w[x];
              da_acc += gs * p_row[x];
            }
            dq_t[y] = dq_acc;
            dk_t[y] = dk_acc;
            da += da_acc;
          }
          // w = beta (v - a r): dv = beta dw, dbeta = <dw, v - a r>, and the product a r gets -beta dw
          float dbt = 0.0f, dar = 0.0f;
#pragma omp simd reduction(+ : dbt, dar)
          for (int64_t x = 0; x < V; ++x) {
            dv_t[x] = bt * dw[x];
            dbt += dw[x] * (v_t[x] - a * r[x]);
            dr[x] = -bt * dw[x];
            dar += dr[x] * r[x];
          }
          da += dar;
          for (int64_t y = 0; y < K; ++y) {  // r = S_{t-1}^T k: dk += a S_{t-1} dr; dS_{t-1} = a (dS_t + k dr^T)
            const float ky = k_t[y];
            const float* p_row = prev + y * V;
            float* g_row = dS + y * V;
            float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
            for (int64_t x = 0; x < V; ++x) {
              acc += p_row[x] * dr[x];
              g_row[x] = a * (g_row[x] + ky * dr[x]);
            }
            dk_t[y] += a * acc;
          }
          db_p[s.g_at(b, t, h)] = dbt;
          dg_p[s.g_at(b, t, h)] = da * a;
        }
      }
      std::memcpy(dS0_p + bh * KV, dS, KV * sizeof(float));
    }
  });
  return {dq, dk, dv, dg, dbeta, dS0};
}
"""


def _self_check(module) -> str | None:
    """Run both walks of the build on small odd shapes against the reference (the lane walk on a
    group and a part of one); None if forward and gradients agree."""
    from .naive import gated_delta_rule_naive

    gen = torch.Generator().manual_seed(0)
    b, t, h, k, v = 2, SPAN + 3, 3 + LANES // 2, 5, 7
    inputs = dict(q=torch.randn(b, t, h, k, generator=gen),
                  k=torch.nn.functional.normalize(torch.randn(b, t, h, k, generator=gen), dim=-1),
                  v=torch.randn(b, t, h, v, generator=gen), g=-torch.rand(b, t, h, generator=gen),
                  beta=torch.rand(b, t, h, generator=gen), initial_state=torch.randn(b, h, k, v, generator=gen))
    for lanes in (False, True):
        error = compare_scans(gated_delta_rule_naive, lambda **kw: _rule(module, **kw, lanes=lanes), inputs, output="o")
        if error is not None:
            return f"{'lane' if lanes else 'row'} walk: {error}"
    return None


RULE = Extension("gated_delta")
RULE.add("gated_delta_rule", SOURCE, ["rule_forward", "rule_backward"], _self_check,
         fallback="the chunked PyTorch form")


def available() -> bool:
    """Whether the C++ kernel compiled here and agrees with the reference (builds it on first call)."""
    return RULE.available("gated_delta_rule")


def build_error() -> str | None:
    """Why the kernel is not used, after `load`; None when it is (or before the first try)."""
    return RULE.build_error("gated_delta_rule")


class _Rule(torch.autograd.Function):
    """The recurrence: (q, k, v, g, beta, S0) -> (o [B, T, H, V], S_T [B, H, K, V])."""

    @staticmethod
    def forward(ctx, module, lanes, q, k, v, g, beta, S0):
        o, last = module.rule_forward(q, k, v, g, beta, S0, SPAN, lanes)
        ctx.module, ctx.lanes = module, lanes
        ctx.save_for_backward(q, k, v, g, beta, S0)
        return o, last

    @staticmethod
    @once_differentiable
    def backward(ctx, do, dlast):
        grads = ctx.module.rule_backward(*ctx.saved_tensors, do.contiguous(), dlast.contiguous(), SPAN, ctx.lanes)
        return None, None, *grads


def _rule(module, q, k, v, g, beta, *, initial_state=None, return_last_state=False, lanes=None):
    """The kernel's call; ``lanes`` forces a walk (None: `by_lanes` chooses)."""
    out_dtype = v.dtype
    q_BTHK, k_BTHK, v_BTHV = (x.float().contiguous() for x in (q, k, v))
    batch, _, heads, key_dim = q_BTHK.shape
    if lanes is None:
        lanes = by_lanes(batch, heads, key_dim, v_BTHV.shape[-1])
    if initial_state is None:
        S0_BHKV = q_BTHK.new_zeros(batch, heads, key_dim, v_BTHV.shape[-1])
    else:
        S0_BHKV = initial_state.float().contiguous()
    o_BTHV, last_BHKV = _Rule.apply(module, lanes, q_BTHK, k_BTHK, v_BTHV, g.float().contiguous(),
                                    beta.float().contiguous(), S0_BHKV)
    o_BTHV = o_BTHV.to(out_dtype)
    return (o_BTHV, last_BHKV) if return_last_state else o_BTHV


def gated_delta_rule_cpu(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    initial_state: torch.Tensor | None = None,
    return_last_state: bool = False,
    chunk_size: int | None = None,
    lanes: bool | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule through the compiled CPU loop; matches `gated_delta_rule_naive`.

    Args:
        q: [B, T, H, K] queries.
        k: [B, T, H, K] keys (unit norm keeps the update a contraction).
        v: [B, T, H, V] values.
        g: [B, T, H] log decay, alpha_t = exp(g_t).
        beta: [B, T, H] write strength.
        initial_state: [B, H, K, V] state before the first step (S^T); zeros if None.
        return_last_state: also return the state after the last step.
        chunk_size: accepted for the chunked form's signature and unused: the loop has no chunks.
        lanes: run the lane walk (True) or the row walk (False); None lets `by_lanes` choose.

    Returns:
        o [B, T, H, V] in v's dtype, or (o, last_state) with last_state [B, H, K, V] in fp32.

    Raises:
        RuntimeError: the kernel did not build or failed its check here (`build_error` says why);
            dispatch checks `available` first and takes the PyTorch path instead.
    """
    return _rule(RULE.require("gated_delta_rule"), q, k, v, g, beta, initial_state=initial_state,
                 return_last_state=return_last_state, lanes=lanes)
