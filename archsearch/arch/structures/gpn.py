"""Grounded Prediction Networks: GPN and GPN+M (Wang 2026, https://arxiv.org/abs/2605.10643).

One state vector per sequence, revisited once per token by the same N recurrent
layers (N = 1 or 2 in the paper). Per token t, with s^p the predicted state and
s^g the grounded one (both zero before the first token):

    s^g_t = Gate_f(s^p_{t-1}) * s^p_{t-1} + W_fuse RMSNorm(E x_t)      # ground with the token
    M_t   = MemWrite(s^g_{t-1}, s^g_t, M_{t-1})                         # GPN+M only, once per token
    c = s^g_t;  for each layer i:  c = Gate_i(c) * c + FFN_i(c) + MemRead_i(c, M_t)
    s^p_t = c;  logits_t = E W_dec RMSNorm(s^p_t)                       # predicts x_{t+1}

Gate(x) = sigmoid(W RMSNorm(x) + b), a full D x D matrix. FFN is SwiGLU with the
layer's ``mlp_width``. The memory is one gated-delta-rule matrix per head, shared
by every layer: written once per token (key from the previous grounded state,
value from the current one) and read by each layer with its own query.
The paper's code (repo ``steve-z-wang/grounded-prediction-network``,
``src/jax/models/sot_m/model.py``) indexes the same recurrence one step later:
its step 0 predicts x_0 from the zero state. Here, as in every archsearch model,
the logits at t see tokens <= t and predict x_{t+1}.

The embedding width E (option ``d_emb``, default d_model) may differ from the
state width D, as in the paper (D = 2496, E = 768 by papers.md's reading):
W_fuse maps E -> D and W_dec maps D -> E, so the tied embedding (or an untied
head) is V x E.

Dimensions: B batch, T time, D state (d_model), E embedding width, F FFN width,
V vocabulary, H memory heads, K key dim, W value dim (W, not V, to keep V for
the vocabulary).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from archsearch_kernels.dispatch import softplus
from torch import nn

from archsearch.arch.blocks import swiglu
from archsearch.arch.spec import ArchSpec, LayerSpec
from archsearch.arch.structures.gpn_counts import (  # the formulas, beside the module
    MIXER,
    GPNOptions,
    embedding_width,
    flops,
    gpn_options,
    mixing,
    paper_params,
    params,
    state,
)
from archsearch.arch.structures.stack import LanguageModel


def l2_normalize(x: torch.Tensor) -> torch.Tensor:
    """x / sqrt(sum x^2 + 1e-12) over the last axis, as the paper's code (zero stays zero)."""
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + 1e-12)


class Gate(nn.Module):
    """``sigmoid(W RMSNorm(x) + b)``: [B, D] -> [B, D]; W, b zero-initialised (gate 0.5)."""

    def __init__(self, *, spec: ArchSpec):
        super().__init__()
        self.norm = nn.RMSNorm(spec.d_model, eps=spec.norm_eps)
        self.proj = nn.Linear(spec.d_model, spec.d_model)

    def forward(self, x_BD: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.proj(self.norm(x_BD)))


class MemoryWrite(nn.Module):
    """One gated-delta-rule write per token into M [B, H, K, W] (fp32).

    Unlike Gated DeltaNet (archsearch_kernels/gated_delta), the recalled value is read from
    the *undecayed* memory, as in the paper's code:
    ``M_t = a M_{t-1} + beta k (v - M_{t-1}^T k)^T``.
    """

    def __init__(self, *, spec: ArchSpec, memory: tuple[int, int, int]):
        super().__init__()
        d = spec.d_model
        self.heads, self.key_dim, self.value_dim = H, K, W = memory
        self.norm = nn.RMSNorm(d, eps=spec.norm_eps)
        self.key = nn.Linear(d, H * K)
        self.value_beta_decay = nn.Linear(d, H * W + 2 * H, bias=False)
        self.A_log = nn.Parameter(torch.zeros(H))
        self.dt_bias = nn.Parameter(torch.zeros(H))

    def forward(self, prev_BD: torch.Tensor, now_BD: torch.Tensor, M_BHKW: torch.Tensor) -> torch.Tensor:
        B, H, K, W = M_BHKW.shape
        k_BHK = l2_normalize(F.relu(self.key(self.norm(prev_BD))).view(B, H, K)).float()
        v_flat, beta_BH, a_BH = self.value_beta_decay(self.norm(now_BD)).float().split([H * W, H, H], dim=-1)
        v_BHW = v_flat.view(B, H, W)
        beta_BH = torch.sigmoid(beta_BH)
        decay_BH = torch.exp(-self.A_log.float().exp() * softplus(a_BH, self.dt_bias))
        recalled_BHW = torch.einsum("bhkw,bhk->bhw", M_BHKW, k_BHK)
        written_BHKW = k_BHK[..., None] * (beta_BH[..., None] * (v_BHW - recalled_BHW))[:, :, None, :]
        return decay_BH[..., None, None] * M_BHKW + written_BHKW


class MemoryRead(nn.Module):
    """``W_o (SiLU(W_g RMSNorm(c)) * RMSNorm(M q))`` with q = l2norm(ReLU(W_q RMSNorm(c) + b))."""

    def __init__(self, *, spec: ArchSpec, memory: tuple[int, int, int]):
        super().__init__()
        d = spec.d_model
        H, K, W = memory
        self.norm = nn.RMSNorm(d, eps=spec.norm_eps)
        self.query = nn.Linear(d, H * K)
        self.gate = nn.Linear(d, H * W, bias=False)
        self.out_norm = nn.RMSNorm(H * W, eps=spec.norm_eps)
        self.out = nn.Linear(H * W, d, bias=False)

    def forward(self, c_BD: torch.Tensor, M_BHKW: torch.Tensor) -> torch.Tensor:
        B, H, K, W = M_BHKW.shape
        h_BD = self.norm(c_BD)
        q_BHK = l2_normalize(F.relu(self.query(h_BD)).view(B, H, K)).float()
        o_BHW = torch.einsum("bhkw,bhk->bhw", M_BHKW, q_BHK).to(c_BD.dtype)
        return self.out(F.silu(self.gate(h_BD)) * self.out_norm(o_BHW.reshape(B, H * W)))


class GPNLayer(nn.Module):
    """``c = Gate(c) * c + FFN(c) [+ MemRead(c, M)]``: FFN, gate and read all see the same c."""

    def __init__(self, *, spec: ArchSpec, layer: LayerSpec, memory: tuple[int, int, int] | None):
        super().__init__()
        self.ffn_norm = nn.RMSNorm(spec.d_model, eps=spec.norm_eps)
        self.ffn = swiglu.SwiGLU(spec=spec, layer=layer)
        self.keep = Gate(spec=spec)
        self.read = None if memory is None else MemoryRead(spec=spec, memory=memory)

    def forward(self, c_BD: torch.Tensor, M_BHKW: torch.Tensor | None) -> torch.Tensor:
        update_BD = self.ffn(self.ffn_norm(c_BD))
        if self.read is not None:
            update_BD = update_BD + self.read(c_BD, M_BHKW)
        return self.keep(c_BD) * c_BD + update_BD


class GPN(LanguageModel):
    """GPN, or GPN+M when ``spec.structure == "gpn_m"``: tokens [B, T] -> logits [B, T, V],
    sequential over T (no time-parallel form: the FFN and gates depend on the state)."""

    def __init__(self, spec: ArchSpec):
        super().__init__(spec)
        opts = gpn_options(spec)
        memory, d, e = opts.memory, spec.d_model, opts.d_emb
        if e != d:  # the frame's embedding and untied head are D wide; here they are E wide
            self.embed = nn.Embedding(spec.vocab_size, e)
            self.head = None if spec.tie_embeddings else nn.Linear(e, spec.vocab_size, bias=False)
        self.fuse_norm = nn.RMSNorm(e, eps=spec.norm_eps)
        self.fuse = nn.Linear(e, d, bias=False)
        self.fuse_keep = Gate(spec=spec)
        self.write = None if memory is None else MemoryWrite(spec=spec, memory=memory)
        self.layers = nn.ModuleList(GPNLayer(spec=spec, layer=layer, memory=memory) for layer in spec.layers)
        self.decode = nn.Linear(d, e, bias=False)
        self.apply(_init_paper)

    def states(self, tokens_BT: torch.Tensor) -> torch.Tensor:
        """The predicted states s^p_t for every t: [B, T, D]."""
        B, T = tokens_BT.shape
        grounding_BTD = self.fuse(self.fuse_norm(self.embed(tokens_BT)))  # [B, T, E] -> [B, T, D], all t at once
        predicted_BD = grounding_BTD.new_zeros(B, self.spec.d_model)
        grounded_prev_BD = torch.zeros_like(predicted_BD)
        M_BHKW = None
        if self.write is not None:
            w = self.write
            M_BHKW = predicted_BD.new_zeros(B, w.heads, w.key_dim, w.value_dim, dtype=torch.float32)
        predicted = []
        for t in range(T):
            grounded_BD = self.fuse_keep(predicted_BD) * predicted_BD + grounding_BTD[:, t]
            if self.write is not None:
                M_BHKW = self.write(grounded_prev_BD, grounded_BD, M_BHKW)
            c_BD = grounded_BD
            for layer in self.layers:
                c_BD = layer(c_BD, M_BHKW)
            predicted.append(c_BD)
            predicted_BD, grounded_prev_BD = c_BD, grounded_BD
        return torch.stack(predicted, dim=1)

    def forward(self, tokens_BT: torch.Tensor) -> torch.Tensor:
        # the paper's factorised tied head: Emb W_dec RMSNorm(s^p); self.norm is that RMSNorm
        x_BTE = self.decode(self.norm(self.states(tokens_BT)))
        weight_VE = self.embed.weight if self.head is None else self.head.weight
        return x_BTE @ weight_VE.T


def _init_paper(module: nn.Module) -> None:
    """The paper's init: LeCun-normal matrices, zero gates (sigmoid 0.5) and FFN outputs,
    N(0, 0.02) memory read-out and embedding, Mamba-style decay parameters."""
    if isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, std=0.02)
    elif isinstance(module, nn.Linear):
        std = module.in_features ** -0.5
        nn.init.trunc_normal_(module.weight, std=std, a=-2 * std, b=2 * std)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    if isinstance(module, Gate):
        nn.init.zeros_(module.proj.weight)
    elif isinstance(module, swiglu.SwiGLU):
        nn.init.zeros_(module.down.weight)
    elif isinstance(module, MemoryRead):
        nn.init.normal_(module.out.weight, std=0.02)
    elif isinstance(module, MemoryWrite):
        with torch.no_grad():
            module.A_log.copy_(torch.empty_like(module.A_log).uniform_(0, 16).clamp_min(1e-8).log())
            dt = torch.exp(torch.rand_like(module.dt_bias) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
            dt = dt.clamp_min(1e-4)
            module.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus
    elif isinstance(module, LanguageModel) and module.head is not None:
        nn.init.normal_(module.head.weight, std=0.02)
