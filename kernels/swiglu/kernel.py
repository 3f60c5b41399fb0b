"""SwiGLU's gating product, fused Triton kernel; same signature and return as `swiglu_naive`.

Dimensions: R rows (leading axes flattened), F width. gate and up may be strided views
(the halves of one fused gate_up projection are), so each row is read through its own row
stride and nothing is copied. With s = sigmoid(gate) and dh the incoming gradient:

    d gate = dh * up * s * (1 + gate * (1 - s))
    d up   = dh * gate * s

The backward recomputes s from gate rather than saving silu(gate).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

BLOCK_F = 1024


@triton.jit
def _swiglu_fwd(gate_ptr, up_ptr, h_ptr, width, gate_row_stride, up_row_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < width
    gate = tl.load(gate_ptr + row * gate_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(up_ptr + row * up_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    h = gate * tl.sigmoid(gate) * up
    tl.store(h_ptr + row * width + cols, h.to(h_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_bwd(dh_ptr, gate_ptr, up_ptr, dgate_ptr, dup_ptr, width, gate_row_stride, up_row_stride,
                BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < width
    gate = tl.load(gate_ptr + row * gate_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(up_ptr + row * up_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    dh = tl.load(dh_ptr + row * width + cols, mask=mask, other=0.0).to(tl.float32)
    s = tl.sigmoid(gate)
    dgate = dh * up * s * (1.0 + gate * (1.0 - s))
    dup = dh * gate * s
    tl.store(dgate_ptr + row * width + cols, dgate.to(dgate_ptr.dtype.element_ty), mask=mask)
    tl.store(dup_ptr + row * width + cols, dup.to(dup_ptr.dtype.element_ty), mask=mask)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """[..., F] -> [R, F] without a copy when the last axis is contiguous."""
    x_RF = x.reshape(math.prod(x.shape[:-1]), x.shape[-1])  # not -1: a zero width would be ambiguous
    return x_RF if x_RF.stride(-1) == 1 else x_RF.contiguous()


def _grid(rows: int, width: int, block: int) -> tuple[int, int]:
    return rows, triton.cdiv(width, block)


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        gate_RF, up_RF = _rows(gate), _rows(up)
        rows, width = gate_RF.shape
        block = min(BLOCK_F, triton.next_power_of_2(max(width, 1)))
        h_RF = torch.empty(rows, width, device=gate.device, dtype=gate.dtype)
        if h_RF.numel():
            _swiglu_fwd[_grid(rows, width, block)](gate_RF, up_RF, h_RF, width, gate_RF.stride(0),
                                                   up_RF.stride(0), BLOCK=block)
        ctx.save_for_backward(gate_RF, up_RF)
        ctx.shape, ctx.up_dtype = gate.shape, up.dtype
        return h_RF.view(gate.shape)

    @staticmethod
    def backward(ctx, dh: torch.Tensor):
        gate_RF, up_RF = ctx.saved_tensors
        rows, width = gate_RF.shape
        block = min(BLOCK_F, triton.next_power_of_2(max(width, 1)))
        dh_RF = dh.reshape(rows, width).contiguous()
        dgate_RF = torch.empty(rows, width, device=dh.device, dtype=gate_RF.dtype)
        dup_RF = torch.empty(rows, width, device=dh.device, dtype=ctx.up_dtype)
        if dh_RF.numel():
            _swiglu_bwd[_grid(rows, width, block)](dh_RF, gate_RF, up_RF, dgate_RF, dup_RF, width,
                                                   gate_RF.stride(0), up_RF.stride(0), BLOCK=block)
        return dgate_RF.view(ctx.shape), dup_RF.view(ctx.shape)


def swiglu_triton(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up fused; matches `swiglu_naive`.

    Args:
        gate: [..., F] gate pre-activation (may be a strided view).
        up: [..., F] the linear branch, same shape.

    Returns:
        h [..., F] in gate's dtype.
    """
    if gate.shape != up.shape:
        raise ValueError(f"swiglu: gate {tuple(gate.shape)} and up {tuple(up.shape)} differ in shape")
    return _SwiGLU.apply(gate, up)
