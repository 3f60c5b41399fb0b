"""SwiGLU's gating product, fused Triton kernel; same signature and return as `swiglu_naive`.

Dimensions: R rows (leading axes flattened), F width. gate and up may be strided views
(the halves of one fused gate_up projection are), so each row is read through its own row
stride and nothing is copied; when they are exactly the halves of one tensor (layout.py), the
gradient of that whole tensor is written in one buffer, skipping autograd's concatenation. With s = sigmoid(gate) and dh the incoming gradient:

    d gate = dh * up * s * (1 + gate * (1 - s))
    d up   = dh * gate * s

The backward recomputes s from gate rather than saving silu(gate).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .layout import halves_of, rows

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
                grad_row_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < width
    gate = tl.load(gate_ptr + row * gate_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(up_ptr + row * up_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    dh = tl.load(dh_ptr + row * width + cols, mask=mask, other=0.0).to(tl.float32)
    s = tl.sigmoid(gate)
    dgate = dh * up * s * (1.0 + gate * (1.0 - s))
    dup = dh * gate * s
    tl.store(dgate_ptr + row * grad_row_stride + cols, dgate.to(dgate_ptr.dtype.element_ty), mask=mask)
    tl.store(dup_ptr + row * grad_row_stride + cols, dup.to(dup_ptr.dtype.element_ty), mask=mask)


def _grid(rows: int, width: int, block: int) -> tuple[int, int]:
    return rows, triton.cdiv(width, block)


def _forward(gate_RF: torch.Tensor, up_RF: torch.Tensor) -> torch.Tensor:
    rows_, width = gate_RF.shape
    h_RF = torch.empty(rows_, width, device=gate_RF.device, dtype=gate_RF.dtype)
    if h_RF.numel():
        block = min(BLOCK_F, triton.next_power_of_2(max(width, 1)))
        _swiglu_fwd[_grid(rows_, width, block)](gate_RF, up_RF, h_RF, width, gate_RF.stride(0),
                                                up_RF.stride(0), BLOCK=block)
    return h_RF


def _backward(dh: torch.Tensor, gate_RF: torch.Tensor, up_RF: torch.Tensor, dgate_RF: torch.Tensor,
              dup_RF: torch.Tensor) -> None:
    """Write d gate and d up into the given [R, F] views, which share one row stride."""
    rows_, width = gate_RF.shape
    dh_RF = dh.reshape(rows_, width).contiguous()
    if dh_RF.numel():
        block = min(BLOCK_F, triton.next_power_of_2(max(width, 1)))
        _swiglu_bwd[_grid(rows_, width, block)](dh_RF, gate_RF, up_RF, dgate_RF, dup_RF, width, gate_RF.stride(0),
                                                up_RF.stride(0), dgate_RF.stride(0), BLOCK=block)


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        gate_RF, up_RF = rows(gate), rows(up)
        ctx.save_for_backward(gate_RF, up_RF)
        ctx.shape, ctx.up_dtype = gate.shape, up.dtype
        return _forward(gate_RF, up_RF).view(gate.shape)

    @staticmethod
    def backward(ctx, dh: torch.Tensor):
        gate_RF, up_RF = ctx.saved_tensors
        dgate_RF = torch.empty(gate_RF.shape, device=dh.device, dtype=gate_RF.dtype)
        dup_RF = torch.empty(up_RF.shape, device=dh.device, dtype=ctx.up_dtype)
        _backward(dh, gate_RF, up_RF, dgate_RF, dup_RF)
        return dgate_RF.view(ctx.shape), dup_RF.view(ctx.shape)


class _SwiGLUPacked(torch.autograd.Function):
    """gate_up [..., 2F] (gate and up are its halves, layout.py) -> h, the gradient as one tensor."""

    @staticmethod
    def forward(ctx, gate_up: torch.Tensor) -> torch.Tensor:
        gu_R2F = rows(gate_up)
        width = gu_R2F.shape[1] // 2
        ctx.save_for_backward(gu_R2F)
        ctx.shape = gate_up.shape
        return _forward(gu_R2F[:, :width], gu_R2F[:, width:]).view(*gate_up.shape[:-1], width)

    @staticmethod
    def backward(ctx, dh: torch.Tensor):
        (gu_R2F,) = ctx.saved_tensors
        width = gu_R2F.shape[1] // 2
        dgu_R2F = torch.empty_like(gu_R2F, memory_format=torch.contiguous_format)
        _backward(dh, gu_R2F[:, :width], gu_R2F[:, width:], dgu_R2F[:, :width], dgu_R2F[:, width:])
        return dgu_R2F.view(ctx.shape)


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
    packed = halves_of(gate, up)
    return _SwiGLUPacked.apply(packed) if packed is not None else _SwiGLU.apply(gate, up)
