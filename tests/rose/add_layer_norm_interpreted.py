"""rose.layers.encoder_norms' kernels under Triton's interpreter (TRITON_INTERPRET=1, numpy on the CPU): add_layer_norm
against torch's LayerNorm(x + residual) (the BERT output layers' definition), embed_layer_norm against HF's embeddings
(word + type, then + position, each sum rounded, then LayerNorm); run by test_rose_fused_encoders.py in a process of its
own (the interpreter is chosen when the kernel module is imported). Prints one line per case and exits 1 on a
mismatch."""

from __future__ import annotations

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"


def check(rows: int, cols: int, dtype, bias: bool, strided: str) -> bool:
    """strided: "" (both contiguous), "both" or "residual" (row strides of their own: x's cols, the residual's
    cols + 40)."""
    import torch
    import torch.nn.functional as F

    from rose.layers import encoder_norms

    g = torch.Generator().manual_seed(rows * 7 + cols)
    wide = torch.randn(2, rows, cols + 40, generator=g).to(dtype)
    x, residual = (wide[i, :, :cols].contiguous() for i in (0, 1))
    if strided == "both":
        x = wide[0, :, 7:7 + cols]
    if strided:
        residual = wide[1, :, 7:7 + cols]
    x = x * 3 + 1 if strided != "both" else x
    weight = (1 + 0.2 * torch.randn(cols, generator=g)).to(dtype)
    b = (0.1 * torch.randn(cols, generator=g)).to(dtype) if bias else None
    got = encoder_norms.add_layer_norm(x, residual, weight, b, 1e-12)
    want = F.layer_norm(x + residual, (cols,), weight, b, 1e-12)
    return report(f"add_layer_norm rows={rows} cols={cols} {dtype} bias={bias} strided={strided}", got, want)


def report(label: str, got, want) -> bool:
    """Prints the case's line; ok when within a rounding step of the output (fp16: the mean and variance summed in
    another order; float32: 1e-6 relative)."""
    import torch

    eps = torch.finfo(want.dtype).eps if want.dtype != torch.float32 else 1e-6
    off = (got.float() - want.float()).abs() / (eps * want.float().abs().clamp_min(1.0))
    ok = got.shape == want.shape and got.dtype == want.dtype and float(off.max()) <= 1.0
    print(f"{label}: max {float(off.max()):.2f} steps {'ok' if ok else 'MISMATCH'}")
    return ok


def check_embed(rows: int, cols: int, dtype, types: str) -> bool:
    """types: none (no type table: DistilBERT, MPNet), row0 (a table, no types given) or given (a type per token)."""
    import torch
    import torch.nn.functional as F

    from rose.layers import encoder_norms

    g = torch.Generator().manual_seed(rows * 5 + cols)
    word, position = torch.randn(50, cols, generator=g).to(dtype), torch.randn(40, cols, generator=g).to(dtype)
    table = torch.randn(2, cols, generator=g).to(dtype) if types != "none" else None
    ids, at = torch.randint(0, 50, (rows,), generator=g), torch.randint(0, 40, (rows,), generator=g)
    kinds = torch.randint(0, 2, (rows,), generator=g) if types == "given" else None
    weight, b = (1 + 0.2 * torch.randn(cols, generator=g)).to(dtype), (0.1 * torch.randn(cols, generator=g)).to(dtype)
    got = encoder_norms.embed_layer_norm(ids, at, kinds, word, position, table, weight, b, 1e-12)
    x = word[ids]
    if table is not None:
        x = x + (table[kinds] if kinds is not None else table[0])
    want = F.layer_norm(x + position[at], (cols,), weight, b, 1e-12)
    return report(f"embed_layer_norm rows={rows} cols={cols} {dtype} types={types}", got, want)


def main() -> int:
    import torch

    from rose.layers import encoder_norms, fused

    fused._use_triton = lambda x: True  # CPU tensors: the interpreter runs the kernel on them
    encoder_norms.ENCODER_NORMS = True  # whatever ROSE_ENCODER_NORMS says: the kernels are checked here
    failed = 0
    for dtype in (torch.float32, torch.float16):
        for rows, cols in ((1, 64), (5, 384), (3, 1000)):  # one row; MiniLM's width; a width past a power of two
            for bias, strided in ((True, ""), (False, "both"), (True, "residual")):
                failed += not check(rows, cols, dtype, bias, strided)
        for types in ("none", "row0", "given"):
            failed += not check_embed(6, 384, dtype, types)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
