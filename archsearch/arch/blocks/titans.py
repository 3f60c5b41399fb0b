"""Titans neural long-term memory as a mixer (memory as a layer).

Behrouz, Zhong & Mirrokni, "Titans: Learning to Memorize at Test Time",
https://arxiv.org/abs/2501.00663 (papers.md section 7). Per head, a small MLP
``M`` is a fast-weight memory, trained while the sequence is read by gradient
descent on the associative loss ``l(M; x_t) = ||M(k_t) - v_t||^2``:

    q, k, v = silu(causal depthwise conv_4(W_q x, W_k x, W_v x));  q, k l2-normalised per head
    theta_t = (max_lr / chunk) sigmoid(.), eta_t = sigmoid(.), alpha_t = sigmoid(.)   from W_g x + bias, per head
    S_t = eta_t S_{t-1} - theta_t clip(grad l(M_c; x_t))  momentum ("surprise"); M_c = memory at chunk start
    M_t = (1 - alpha_t) M_{t-1} + S_t                     forgetting gate as weight decay
    o_t = M_t(q_t);   y = W_o (RMSNorm_head(o) * silu(W_a x))

Chunks (``options["chunk"]``) follow the paper's parallel training: every
token of a chunk takes its gradient at the memory from the chunk's start (a
mini-batch step), while momentum, decay and the read stay per token, so token
t reads ``M_t``, which holds tokens <= t and nothing later (``memory_chunked``).
``chunk=1`` is plain online gradient descent, run as a token loop
(``memory_online``). ``memory_reference`` is the spec both must equal: a token
loop with autograd's inner gradients. Only the memory is here: the MAL hybrid
of the paper (memory layer, then sliding-window attention) is a layer pattern
of this mixer and ``attention`` in the spec's tuple.

Options (``layer.options``), with defaults:
    memory_depth  2      layers of the memory MLP: 1 (linear, W: K -> K) or 2 (K -> E -> K, SiLU)
    memory_width  2K     E, the hidden width per head of a depth-2 memory
    chunk         16     tokens per mini-batch gradient step
    d_conv        4      short conv width (0: no conv)
    max_lr        0.5    upper end of theta times chunk: the step a whole chunk of alike gradients
                         can take; 0.5 lets a linear memory with a unit key overwrite at most
    max_grad_norm 1.0    each token's gradient of each memory layer is clipped to this Frobenius
                         norm before the step (not in the paper; keeps a deep memory from diverging)

Dimensions: B batch, T time, D model width, H heads, K head dim (D = H K), E memory
hidden width, N tokens in a chunk, I/O a memory layer's input/output width.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from archsearch.arch.blocks.titans_counts import (  # the formulas, beside the module
    MemorySizes,
    flops,
    mixing,
    params,
    sizes,
    state,
)
from archsearch.arch.spec import ArchSpec, LayerSpec


class Titans(nn.Module):
    """Titans long-term memory mixer: [B, T, D] -> [B, T, D]. No biases in the projections."""

    def __init__(self, *, spec: ArchSpec, layer: LayerSpec):
        super().__init__()
        s = self.sizes = sizes(spec, layer)
        d, h = s.d_model, s.heads
        self.qkv_proj = nn.Linear(d, 3 * d, bias=False)
        self.conv = nn.Conv1d(3 * d, 3 * d, s.conv, groups=3 * d, bias=False) if s.conv else None
        # logits of theta, eta, alpha per head; the biases live outside the Linear so that
        # the stack's init (which zeroes Linear biases) keeps them: theta = max_lr/(2 chunk),
        # eta = 1/2, alpha = sigmoid(-4) ~ 0.018 (a memory that forgets over ~50 tokens)
        self.gate_proj = nn.Linear(d, 3 * h, bias=False)
        self.gate_bias = nn.Parameter(torch.tensor([0.0] * h + [0.0] * h + [-4.0] * h))
        self.gate_bias._no_weight_decay = True
        # the memory's initial weights, learned by the outer optimizer. A linear memory starts
        # empty. A deep one starts with hidden activations of norm ~1 for a unit key (first
        # layer std 2/sqrt(E), where silu(z) ~ z/2): the inner step on the second layer scales
        # with that norm squared, and theta * chunk <= max_lr keeps it stable only near 1
        self.memory = nn.ParameterList(nn.Parameter(torch.zeros(h, o, i)) for o, i in s.shapes)
        if s.depth == 2:
            nn.init.normal_(self.memory[0], std=2 * s.hidden**-0.5)
            nn.init.normal_(self.memory[1], std=s.hidden**-0.5)
        self.norm_weight = nn.Parameter(torch.ones(d))  # 1-d, so the optimizer does not decay it
        self.out_gate = nn.Linear(d, d, bias=False)
        self.out_proj = nn.Linear(d, d, bias=False)

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        s, (B, T, D) = self.sizes, x_BTD.shape
        H, K = s.heads, s.key
        qkv_BXT = self.qkv_proj(x_BTD).transpose(1, 2)
        if self.conv is not None:
            # left padding only: causal, and torch counts exactly k MACs per output
            qkv_BXT = self.conv(F.pad(qkv_BXT, (s.conv - 1, 0)))
        q_BTD, k_BTD, v_BTD = F.silu(qkv_BXT.transpose(1, 2)).chunk(3, dim=-1)
        q_BHTK = F.normalize(q_BTD.view(B, T, H, K).transpose(1, 2).float(), dim=-1)
        k_BHTK = F.normalize(k_BTD.view(B, T, H, K).transpose(1, 2).float(), dim=-1)
        v_BHTK = v_BTD.view(B, T, H, K).transpose(1, 2).float()
        theta_BHT, log_eta_BHT, log_keep_BHT = self.gates(x_BTD)
        # chunk 1 is plain online GD: a token loop with fewer ops than the chunk form at N = 1
        rule = memory_online if s.chunk == 1 else partial(memory_chunked, chunk=s.chunk)
        o_BHTK = rule(q_BHTK, k_BHTK, v_BHTK, theta_BHT, log_eta_BHT, log_keep_BHT,
                      [w.float() for w in self.memory], max_grad_norm=s.max_grad_norm)
        o_BHTK = F.rms_norm(o_BHTK, (K,), eps=1e-6) * self.norm_weight.float().view(H, 1, K)
        o_BTD = o_BHTK.transpose(1, 2).reshape(B, T, D).type_as(x_BTD)
        return self.out_proj(o_BTD * F.silu(self.out_gate(x_BTD)))

    def gates(self, x_BTD: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """theta (step size), log eta (momentum) and log(1 - alpha) (kept fraction), each [B, H, T], fp32."""
        logits_BT3H = self.gate_proj(x_BTD).float() + self.gate_bias.float()
        theta, eta, alpha = logits_BT3H.transpose(1, 2).chunk(3, dim=1)
        s = self.sizes
        # every gradient of a chunk is taken at the same weights, so alike gradients add up
        # unchecked until the next chunk: bound the chunk's sum, as mini-batch GD averages
        # (TTT, https://arxiv.org/abs/2407.04620); with chunk 1 this is online GD with theta <= max_lr
        return s.max_lr / s.chunk * torch.sigmoid(theta), F.logsigmoid(eta), F.logsigmoid(-alpha)


def _silu_grad(z: torch.Tensor) -> torch.Tensor:
    s = torch.sigmoid(z)
    return s * (1 + z * (1 - s))


def _mlp(weights: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """The memory MLP with per-(batch, head) weights [B, H, O, I] on x [B, H, N, I]: SiLU between layers."""
    for depth, w in enumerate(weights):
        x = x @ w.mT
        if depth < len(weights) - 1:
            x = F.silu(x)
    return x


def memory_chunked(q_BHTK: torch.Tensor, k_BHTK: torch.Tensor, v_BHTK: torch.Tensor, theta_BHT: torch.Tensor,
                   log_eta_BHT: torch.Tensor, log_keep_BHT: torch.Tensor, init: list[torch.Tensor], *, chunk: int,
                   max_grad_norm: float = float("inf"), states: list | None = None) -> torch.Tensor:
    """Read o_t = M_t(q_t) [B, H, T, K] while M learns (k_t -> v_t) chunk by chunk.

    ``init`` holds the memory's initial weights, one [H, O, I] per layer; momentum
    starts at zero. Within a chunk every gradient is taken at the chunk-start
    weights, so M_t is that memory plus a weighted sum of rank-one gradients,
    and the read needs no per-token weights (the TTT "dual form"). Each token's
    gradient of each layer is clipped to ``max_grad_norm`` (Frobenius). When
    ``states`` is a list, the (weights, momenta) entering each chunk are
    appended to it. Computes in the inputs' dtype; ``memory_reference`` is the
    same map written as a loop over tokens with autograd gradients.
    """
    B, T = q_BHTK.shape[0], q_BHTK.shape[2]
    weights = [w.expand(B, *w.shape) for w in init]
    momenta = [torch.zeros_like(w) for w in weights]
    out = []
    for start in range(0, T, chunk):
        if states is not None:
            states.append((weights, momenta))
        part = slice(start, start + chunk)
        o_BHNK, weights, momenta = _chunk(q_BHTK[:, :, part], k_BHTK[:, :, part], v_BHTK[:, :, part],
                                          theta_BHT[..., part], log_eta_BHT[..., part], log_keep_BHT[..., part],
                                          weights, momenta, max_grad_norm)
        out.append(o_BHNK)
    return torch.cat(out, dim=2)


def _chunk(q, k, v, theta_BHN, log_eta_BHN, log_keep_BHN, weights, momenta, max_grad_norm):
    """One chunk of ``memory_chunked``: the reads, then the weights and momenta after it."""
    N = q.shape[2]
    # inner forward and backward on the keys at the chunk-start weights: the gradient of
    # token i for layer l is the outer product deltas[l][i] (x) inputs[l][i]
    inputs, pre = [k], []
    for depth, w in enumerate(weights):
        pre.append(inputs[-1] @ w.mT)  # [B, H, N, O]
        inputs.append(F.silu(pre[-1]) if depth < len(weights) - 1 else pre[-1])
    deltas = [2 * (inputs.pop() - v)]
    for depth in range(len(weights) - 1, 0, -1):
        deltas.insert(0, (deltas[0] @ weights[depth]) * _silu_grad(pre[depth - 1]))
    # a rank-one gradient's norm is |delta| |input|; clipping scales its delta
    deltas = [delta / (delta.norm(dim=-1) * inp.norm(dim=-1) / max_grad_norm).clamp(min=1.0)[..., None]
              for delta, inp in zip(deltas, inputs)]
    # with E_t = prod eta and A_t = prod (1 - alpha) over the chunk so far:
    #   S_t = E_t S_0 - sum_{i<=t} (E_t/E_i) theta_i g_i
    #   M_t = A_t M_0 + sum_{s<=t} (A_t/A_s) S_s
    #       = A_t M_0 + [sum_s (A_t/A_s) E_s] S_0 - sum_i theta_i [sum_{i<=s<=t} (A_t/A_s)(E_s/E_i)] g_i
    log_e_BHN, log_a_BHN = log_eta_BHN.cumsum(-1), log_keep_BHN.cumsum(-1)
    future_NN = torch.ones(N, N, dtype=torch.bool, device=q.device).triu(1)
    eta_ratio_BHNN = (log_e_BHN[..., :, None] - log_e_BHN[..., None, :]).masked_fill(future_NN, -torch.inf).exp()
    keep_ratio_BHNN = (log_a_BHN[..., :, None] - log_a_BHN[..., None, :]).masked_fill(future_NN, -torch.inf).exp()
    grad_coef_BHNN = -(keep_ratio_BHNN @ eta_ratio_BHNN) * theta_BHN[..., None, :]
    init_coef_BHN = log_a_BHN.exp()
    momentum_coef_BHN = (keep_ratio_BHNN @ log_e_BHN.exp()[..., None]).squeeze(-1)
    # read: M_t(q_t), one layer at a time, without forming M_t
    x = q
    for depth, (w, m) in enumerate(zip(weights, momenta)):
        z = (init_coef_BHN[..., None] * (x @ w.mT) + momentum_coef_BHN[..., None] * (x @ m.mT)
             + ((x @ inputs[depth].mT) * grad_coef_BHNN) @ deltas[depth])
        x = F.silu(z) if depth < len(weights) - 1 else z
    # the memory and momentum after the chunk's last token
    last_grad_BHN = grad_coef_BHNN[..., -1, :]
    last_momentum_BHN = -eta_ratio_BHNN[..., -1, :] * theta_BHN
    a, b, e = (c[..., -1, None, None] for c in (init_coef_BHN, momentum_coef_BHN, log_e_BHN.exp()))
    new_weights = [a * w + b * m + (delta * last_grad_BHN[..., None]).mT @ inp
                   for w, m, delta, inp in zip(weights, momenta, deltas, inputs)]
    new_momenta = [e * m + (delta * last_momentum_BHN[..., None]).mT @ inp
                   for m, delta, inp in zip(momenta, deltas, inputs)]
    return x, new_weights, new_momenta


def memory_online(q_BHTK: torch.Tensor, k_BHTK: torch.Tensor, v_BHTK: torch.Tensor, theta_BHT: torch.Tensor,
                  log_eta_BHT: torch.Tensor, log_keep_BHT: torch.Tensor, init: list[torch.Tensor], *,
                  max_grad_norm: float = float("inf")) -> torch.Tensor:
    """``memory_chunked`` at chunk 1: each token steps the memory by its own gradient, then reads."""
    B, T = q_BHTK.shape[0], q_BHTK.shape[2]
    weights = [w.expand(B, *w.shape) for w in init]
    momenta = [torch.zeros_like(w) for w in weights]
    eta_BHT, keep_BHT = log_eta_BHT.exp(), log_keep_BHT.exp()
    out = []
    for t in range(T):
        inputs, pre = [k_BHTK[:, :, t:t + 1]], []  # [B, H, 1, I]
        for depth, w in enumerate(weights):
            pre.append(inputs[-1] @ w.mT)
            inputs.append(F.silu(pre[-1]) if depth < len(weights) - 1 else pre[-1])
        deltas = [2 * (inputs.pop() - v_BHTK[:, :, t:t + 1])]
        for depth in range(len(weights) - 1, 0, -1):
            deltas.insert(0, (deltas[0] @ weights[depth]) * _silu_grad(pre[depth - 1]))
        theta, eta, keep = (x[:, :, t, None, None] for x in (theta_BHT, eta_BHT, keep_BHT))
        scaled = [theta / (delta.norm(dim=-1, keepdim=True) * inp.norm(dim=-1, keepdim=True)
                           / max_grad_norm).clamp(min=1.0) for delta, inp in zip(deltas, inputs)]
        momenta = [eta * m - (c * delta).mT @ inp for m, c, delta, inp in zip(momenta, scaled, deltas, inputs)]
        weights = [keep * w + m for w, m in zip(weights, momenta)]
        out.append(_mlp(weights, q_BHTK[:, :, t:t + 1]))
    return torch.cat(out, dim=2)


def memory_reference(q_BHTK: torch.Tensor, k_BHTK: torch.Tensor, v_BHTK: torch.Tensor, theta_BHT: torch.Tensor,
                     log_eta_BHT: torch.Tensor, log_keep_BHT: torch.Tensor, init: list[torch.Tensor], *,
                     chunk: int, max_grad_norm: float = float("inf")) -> torch.Tensor:
    """``memory_chunked`` as the spec: a loop over tokens, gradients from autograd, weights formed per token."""
    B, T = q_BHTK.shape[0], q_BHTK.shape[2]
    differentiable = torch.is_grad_enabled()
    memory = [w.expand(B, *w.shape).clone() for w in init]
    momenta = [torch.zeros_like(w) for w in memory]
    out = []
    for t in range(T):
        if t % chunk == 0:
            # in a graph, the inner gradient stays differentiable (create_graph below)
            at_chunk_start = [w if w.requires_grad else w.detach().requires_grad_(True) for w in memory]
        with torch.enable_grad():
            loss = (_mlp(at_chunk_start, k_BHTK[:, :, t:t + 1]) - v_BHTK[:, :, t:t + 1]).pow(2).sum()
            # per (batch, head) gradients in one call: their weights are separate
            grads = torch.autograd.grad(loss, at_chunk_start, create_graph=differentiable)
        grads = [g / (g.norm(dim=(-2, -1), keepdim=True) / max_grad_norm).clamp(min=1.0) for g in grads]
        theta, eta, keep = (x[:, :, t, None, None] for x in (theta_BHT, log_eta_BHT.exp(), log_keep_BHT.exp()))
        momenta = [eta * m - theta * g for m, g in zip(momenta, grads)]
        memory = [keep * w + m for w, m in zip(memory, momenta)]
        out.append(_mlp(memory, q_BHTK[:, :, t:t + 1]))
    return torch.cat(out, dim=2)
