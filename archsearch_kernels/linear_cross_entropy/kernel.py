"""Linear head + cross-entropy, chunked over tokens with a Triton softmax kernel.

Same signature and return as `linear_cross_entropy_naive` (plus `chunk_size`); see
tests/kernels/test_triton.py (`LINEAR_CE_SHAPES`). Dimensions: N tokens, C tokens in a chunk,
D width, V vocabulary.

The full logits are N x V (at N = 16k tokens and V = 128k, 8 GB in fp32), more than the
rest of a small model's activations together. Here the tokens are cut into chunks of C
rows; for each chunk

    logits_CV = x_C @ W^T                           (a matmul, cuBLAS)
    Triton, per row: logsumexp by an online max over V blocks, loss = lse - logit[target],
           and the logits overwritten in place by d loss / d logits = (softmax - onehot) / n
    dx_C  = dlogits_CV @ W;   dW += dlogits_CV^T @ x_C

so only C x V logits ever exist. The gradients are made in the forward, while the chunk's
logits are at hand (this is why the op is one autograd.Function, not a head and a loss);
the backward only scales them by the incoming gradient of the loss. Under no_grad the
gradient matmuls are skipped.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

BLOCK_V = 1024


@triton.jit
def _cross_entropy_rows(logits_ptr, targets_ptr, loss_ptr, vocab, row_stride, ignore_index, scale,
                        WRITE_GRAD: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * row_stride
    target = tl.load(targets_ptr + row)
    # pass 1: running max m and sum of exp(logit - m), rescaled whenever m grows
    m = -float("inf")
    total = 0.0
    for start in range(0, vocab, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        logit = tl.load(base + cols, mask=cols < vocab, other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(logit, axis=0))
        total = total * tl.exp(m - m_new) + tl.sum(tl.exp(logit - m_new), axis=0)
        m = m_new
    lse = m + tl.log(total)
    scored = target != ignore_index
    safe_target = tl.where(scored, target, 0)
    target_logit = tl.load(base + safe_target).to(tl.float32)
    tl.store(loss_ptr + row, tl.where(scored, lse - target_logit, 0.0))
    if WRITE_GRAD:
        # pass 2: (softmax - onehot) * scale in place of the logits; zero for unscored rows
        row_scale = tl.where(scored, scale, 0.0)
        for start in range(0, vocab, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < vocab
            logit = tl.load(base + cols, mask=mask, other=0.0).to(tl.float32)
            grad = tl.exp(logit - lse) - tl.where(cols == safe_target, 1.0, 0.0)
            tl.store(base + cols, (grad * row_scale).to(logits_ptr.dtype.element_ty), mask=mask)


def _chunk_rows(tokens: int, width: int, vocab: int) -> int:
    """Chunks whose logits are about as large as x itself: C V ~ N D."""
    return max(1, min(tokens, math.ceil(tokens * width / vocab)))


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ignore_index: int,
                chunk_size: int | None) -> torch.Tensor:
        width = x.shape[-1]
        x_ND, targets_N = x.reshape(-1, width), targets.reshape(-1)
        tokens, vocab = x_ND.shape[0], weight.shape[0]
        need_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        scored = (targets_N != ignore_index).sum()
        # the mean is over scored rows; fold 1/n into the logits' gradient now
        scale = 1.0 / max(int(scored.item()), 1)
        weight_VD = weight.to(x.dtype)
        loss_N = torch.empty(tokens, device=x.device, dtype=torch.float32)
        dx_ND = torch.zeros_like(x_ND) if need_grad else None
        dweight_VD = torch.zeros(vocab, width, device=x.device, dtype=torch.float32) if need_grad else None
        chunk = chunk_size or _chunk_rows(tokens, width, vocab)
        for start in range(0, tokens, chunk):
            x_CD = x_ND[start:start + chunk]
            # logits in fp32 so the gradient written over them keeps its small entries
            logits_CV = (x_CD @ weight_VD.T).float()
            _cross_entropy_rows[(x_CD.shape[0],)](logits_CV, targets_N[start:start + chunk].contiguous(),
                                                  loss_N[start:start + chunk], vocab, logits_CV.stride(0),
                                                  ignore_index, scale, WRITE_GRAD=need_grad,
                                                  BLOCK=min(BLOCK_V, triton.next_power_of_2(vocab)))
            if need_grad:
                dlogits_CV = logits_CV.to(x.dtype)
                dx_ND[start:start + chunk] = dlogits_CV @ weight_VD
                dweight_VD += (dlogits_CV.T @ x_CD).float()
        ctx.save_for_backward(dx_ND, dweight_VD)
        ctx.shapes = (x.shape, weight.dtype)
        loss = loss_N.sum() / scored if tokens else loss_N.sum() / 0.0
        return loss

    @staticmethod
    def backward(ctx, d_loss: torch.Tensor):
        dx_ND, dweight_VD = ctx.saved_tensors
        x_shape, weight_dtype = ctx.shapes
        dx = (dx_ND * d_loss.to(dx_ND.dtype)).view(x_shape) if ctx.needs_input_grad[0] else None
        dweight = (dweight_VD * d_loss).to(weight_dtype) if ctx.needs_input_grad[1] else None
        return dx, dweight, None, None, None


def linear_cross_entropy_triton(x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *,
                                ignore_index: int = -100, chunk_size: int | None = None) -> torch.Tensor:
    """Mean cross-entropy of ``x @ weight.T`` without materialising the logits; matches
    `linear_cross_entropy_naive`.

    Args:
        x: [..., D] hidden states.
        weight: [V, D] output embedding.
        targets: [...] int64 class ids, `ignore_index` for unscored rows.
        ignore_index: target value that is left out of the mean.
        chunk_size: tokens per chunk; only memory and speed depend on it. None sizes the
            chunk's logits like x.

    Returns:
        The scalar fp32 mean loss (NaN when no row is scored).
    """
    return _LinearCrossEntropy.apply(x, weight, targets, ignore_index, chunk_size)
