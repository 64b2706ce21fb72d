"""The BERT family's norms in one kernel each (Triton on CUDA, torch's own ops elsewhere): every output layer's
residual add + LayerNorm (HF's BertSelfOutput / BertOutput; RoBERTa, XLM-R, MPNet and DistilBERT alike) and the
embeddings' gathers, sums and LayerNorm. Two and five kernels before, one each now, HF's rounding kept (each sum
rounded to the activation dtype, the norm in float32, one rounding at the end).

On by default (ROSE_ENCODER_NORMS=0 turns them off, as does ROSE_FUSED_KERNELS=0): on an H100 at 573725c the BERT
families' GPU parity held with them and all-MiniLM's 1 x 128 fell 0.326 -> 0.282 ms, its 100 documents +15 to +28 %
tokens/s (benchmarks/NOTES.md, "The encoders' norms in one kernel each"). The decoders' fused kernels, whose switch
and Triton import these share, are rose.layers.fused.
"""

from __future__ import annotations

import os

import torch

from rose.layers import fused
from rose.layers.fused import triton

ENCODER_NORMS = fused.ENABLED and os.environ.get("ROSE_ENCODER_NORMS", "1").strip().lower() not in ("0", "false", "off")


def add_layer_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   eps: float) -> torch.Tensor:
    """x, residual [T, hidden] (rows may be strided) -> LayerNorm(x + residual), contiguous, as the BERT family's
    output layers compute it (HF's BertSelfOutput / BertOutput): the sum rounded to x's dtype, the norm in float32,
    one rounding at the end. One kernel where torch runs two (the add, then layer_norm), and one pass less over the
    activations."""
    if not (ENCODER_NORMS and fused._use_triton(x)) or not _kernel_reads(x, residual):
        return torch.nn.functional.layer_norm(x + residual, (x.shape[-1],), weight, bias, eps)
    rows, cols = x.shape
    out = torch.empty((rows, cols), dtype=x.dtype, device=x.device)
    _add_layer_norm_kernel[(rows,)](x, residual, weight, bias if bias is not None else weight, out, cols,
                                    x.stride(0), residual.stride(0), eps, HAS_BIAS=bias is not None,
                                    **fused.row_launch(cols))
    return out


def embed_layer_norm(ids: torch.Tensor, positions: torch.Tensor, types: torch.Tensor | None, word: torch.Tensor,
                     position: torch.Tensor, token_type: torch.Tensor | None, weight: torch.Tensor,
                     bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    """The BERT family's embeddings [T, hidden]: LayerNorm(word[ids] + token_type[types] + position[positions]) as HF
    sums them (word + type, then + position, each sum rounded to the tables' dtype); `types` None reads the type
    table's row 0, `token_type` None (DistilBERT, MPNet) has no type term. One kernel where torch runs five. The
    indices are the engine's, checked against the tables on the host (rose.meta.pack_batch): the kernel reads what
    they point at, where torch would assert on one out of range."""
    if not (ENCODER_NORMS and fused._use_triton(word)) or not _kernel_reads(word, position, token_type, ids,
                                                                            positions, types):
        x = torch.nn.functional.embedding(ids, word)
        if token_type is not None:
            x = x + (token_type[0] if types is None else torch.nn.functional.embedding(types, token_type))
        x = x + torch.nn.functional.embedding(positions, position)
        return torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, eps)
    rows, cols = ids.shape[0], word.shape[1]
    out = torch.empty((rows, cols), dtype=word.dtype, device=word.device)
    mode = 0 if token_type is None else 1 if types is None else 2
    _embed_layer_norm_kernel[(rows,)](ids, positions, types if mode == 2 else ids, word, position,
                                      token_type if mode else word, weight, bias if bias is not None else weight,
                                      out, cols, word.stride(0), position.stride(0),
                                      token_type.stride(0) if mode else 0, eps, TYPES=mode,
                                      HAS_BIAS=bias is not None, **fused.row_launch(cols))
    return out


def _kernel_reads(*tensors: torch.Tensor | None) -> bool:
    """Whether the kernels can read these as they index them: 2-D tensors contiguous along a row (rows may be
    strided), index vectors whole."""
    return all(t is None or (t.is_contiguous() if t.dim() == 1 else t.stride(-1) == 1) for t in tensors)


if triton is not None:
    import triton.language as tl

    @triton.jit
    def _layer_norm_row(h, offs, mask, cols, w_ptr, b_ptr, eps, HAS_BIAS: tl.constexpr):
        """One row's LayerNorm in float32: (h - mean) * rstd * w (+ b)."""
        mean = tl.sum(h, axis=0) / cols
        d = tl.where(mask, h - mean, 0.0)
        rstd = tl.rsqrt(tl.sum(d * d, axis=0) / cols + eps)
        y = d * rstd * tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        if HAS_BIAS:
            y += tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        return y

    @triton.jit
    def _add_layer_norm_kernel(x_ptr, res_ptr, w_ptr, b_ptr, out_ptr, cols, x_stride, res_stride, eps,
                               HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        mask = offs < cols
        x = tl.load(x_ptr + row * x_stride + offs, mask=mask, other=0.0).to(tl.float32)
        r = tl.load(res_ptr + row * res_stride + offs, mask=mask, other=0.0).to(tl.float32)
        h = (x + r).to(out_ptr.dtype.element_ty).to(tl.float32)  # the sum rounded as torch's add rounds it
        y = _layer_norm_row(h, offs, mask, cols, w_ptr, b_ptr, eps, HAS_BIAS)
        tl.store(out_ptr + row * cols + offs, y.to(out_ptr.dtype.element_ty), mask=mask)  # out: contiguous

    @triton.jit
    def _embed_layer_norm_kernel(ids_ptr, pos_ptr, types_ptr, word_ptr, position_ptr, type_ptr, w_ptr, b_ptr,
                                 out_ptr, cols, word_stride, position_stride, type_stride, eps,
                                 TYPES: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        mask = offs < cols
        dtype = out_ptr.dtype.element_ty
        token = tl.load(ids_ptr + row).to(tl.int64)
        h = tl.load(word_ptr + token * word_stride + offs, mask=mask, other=0.0).to(tl.float32)
        if TYPES == 1:  # no token types given: the type table's row 0
            h = (h + tl.load(type_ptr + offs, mask=mask, other=0.0).to(tl.float32)).to(dtype).to(tl.float32)
        if TYPES == 2:
            kind = tl.load(types_ptr + row).to(tl.int64)
            t = tl.load(type_ptr + kind * type_stride + offs, mask=mask, other=0.0).to(tl.float32)
            h = (h + t).to(dtype).to(tl.float32)
        at = tl.load(pos_ptr + row).to(tl.int64)
        h = (h + tl.load(position_ptr + at * position_stride + offs, mask=mask, other=0.0).to(tl.float32))
        h = h.to(dtype).to(tl.float32)
        y = _layer_norm_row(h, offs, mask, cols, w_ptr, b_ptr, eps, HAS_BIAS)
        tl.store(out_ptr + row * cols + offs, y.to(dtype), mask=mask)
