"""RMSNorm, fused Triton kernel: one pass over each row forward, one backward.

Same signature and return as `rms_norm_naive`; see tests/kernels/test_rmsnorm.py.
Dimensions: R rows, D width (padded to a power of two inside a program, masked).

Forward: each program normalises one row and keeps its 1/rms (R floats) for the backward.
Backward, with x_hat = x * rstd and g = dy * weight:

    dx = rstd * (g - x_hat * mean(g * x_hat))
    dw = sum over rows of dy * x_hat

dw is a reduction over all rows; each of G programs sums a strided share of the rows in
registers and writes one [D] partial, and torch adds the G partials (no atomics, so the
result does not depend on scheduling).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_fwd(x_ptr, w_ptr, y_ptr, rstd_ptr, width, eps, BLOCK_D: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    mask = cols < width
    x = tl.load(x_ptr + row * width + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / width + eps)
    tl.store(rstd_ptr + row, rstd)
    tl.store(y_ptr + row * width + cols, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rms_norm_bwd(dy_ptr, x_ptr, w_ptr, rstd_ptr, dx_ptr, dw_partial_ptr, rows, rows_per_program, width,
                  BLOCK_D: tl.constexpr):
    program = tl.program_id(0).to(tl.int64)
    programs = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_D)
    mask = cols < width
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK_D], dtype=tl.float32)
    for i in range(0, rows_per_program):
        row = program + i * programs
        # broadcast the row test over the columns: a scalar bool mask is not accepted everywhere
        row_mask = mask & ((cols * 0 + row) < rows)
        offset = row * width + cols
        x = tl.load(x_ptr + offset, mask=row_mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + offset, mask=row_mask, other=0.0).to(tl.float32)
        # a row past the end reads the last row's rstd; its masked x and dy make it add 0
        rstd = tl.load(rstd_ptr + tl.minimum(row, rows - 1))
        x_hat = x * rstd
        g = dy * w
        dx = rstd * (g - x_hat * (tl.sum(g * x_hat, axis=0) / width))
        tl.store(dx_ptr + offset, dx.to(dx_ptr.dtype.element_ty), mask=row_mask)
        dw += dy * x_hat
    tl.store(dw_partial_ptr + program * width + cols, dw, mask=mask)


def _block(width: int) -> int:
    return triton.next_power_of_2(width)


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        width = x.shape[-1]
        x_RD = x.reshape(math.prod(x.shape[:-1]), width).contiguous()  # not -1: a zero width would be ambiguous
        rows = x_RD.shape[0]
        y_RD = torch.empty_like(x_RD)
        rstd_R = torch.empty(rows, device=x.device, dtype=torch.float32)
        if x_RD.numel():
            _rms_norm_fwd[(rows,)](x_RD, weight.contiguous(), y_RD, rstd_R, width, eps, BLOCK_D=_block(width))
        ctx.save_for_backward(x_RD, weight, rstd_R)
        return y_RD.view(x.shape)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x_RD, weight, rstd_R = ctx.saved_tensors
        rows, width = x_RD.shape
        dy_RD = dy.reshape(rows, width).contiguous()
        dx_RD = torch.empty_like(x_RD)
        # enough programs to fill a GPU, few enough that the partials stay small
        programs = max(1, min(rows, 4 * _multiprocessors(x_RD.device)))
        dw_partial_GD = torch.empty(programs, width, device=x_RD.device, dtype=torch.float32)
        if x_RD.numel():
            _rms_norm_bwd[(programs,)](dy_RD, x_RD, weight.contiguous(), rstd_R, dx_RD, dw_partial_GD,
                                       rows, triton.cdiv(rows, programs), width,
                                       BLOCK_D=_block(width))
        else:
            dw_partial_GD.zero_()
        return dx_RD.view(dy.shape), dw_partial_GD.sum(0).to(weight.dtype), None


def _multiprocessors(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm over the last axis; matches `rms_norm_naive`.

    Args:
        x: [..., D] input.
        weight: [D] scale.
        eps: added to the mean square before the square root.

    Returns:
        y [..., D] in x's dtype.
    """
    return _RMSNorm.apply(x, weight, eps)
