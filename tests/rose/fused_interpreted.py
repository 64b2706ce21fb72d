"""rose.layers.fused's row-scale variants (folded norms) under Triton's interpreter (TRITON_INTERPRET=1, numpy
on the CPU) against the torch definitions, float32 and float16 (the interpreter mishandles bf16 loads); run by
test_rose_folded_norms.py in a process of its own. Prints one line per case and exits 1 on a mismatch."""

from __future__ import annotations

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from rose.layers import fused  # noqa: E402


def close(a, b, dtype) -> bool:
    err = ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12)).item()
    return err < (1e-5 if dtype == torch.float32 else 3e-3)


def qk_case(tokens, heads, kv_heads, d, hidden, norm, block, dtype) -> bool:
    g = torch.Generator().manual_seed(tokens + heads)
    h = (torch.randn(tokens, hidden, generator=g) * 2).to(dtype)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * d, generator=g).to(dtype)
    qw, kw = (torch.rand(d, generator=g) + 0.5).to(dtype), (torch.rand(d, generator=g) + 0.5).to(dtype)
    pos = torch.randint(0, 5000, (tokens,), generator=g)
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    ref_qkv, orig = qkv.clone(), qkv.clone()
    q_ref, k_ref = fused.qk_norm_rope(ref_qkv, qw, kw, pos, inv_freq, heads, kv_heads, d, 1e-6, norm=norm,
                                      row_scale_of=h)  # the CPU tensors take the torch path
    q = torch.full((tokens, heads, d), float("nan"), dtype=dtype)
    k = torch.full((tokens, kv_heads, d), float("nan"), dtype=dtype)
    fused.launch_qk_norm_rope(qkv, q, k, qw, kw, pos, inv_freq, 1e-6, block_tokens=block, norm=norm, row_scale_of=h)
    v0 = (heads + kv_heads) * d
    return close(q, q_ref, dtype) and close(k, k_ref, dtype) and close(qkv[:, v0:], ref_qkv[:, v0:], dtype) \
        and torch.equal(qkv[:, :v0], orig[:, :v0])  # q and k are read, not written


def act_case(tokens, inner, hidden, dtype) -> bool:
    g = torch.Generator().manual_seed(inner)
    h = (torch.randn(tokens, hidden, generator=g) * 2).to(dtype)
    gate_up = torch.randn(tokens, 2 * inner, generator=g).to(dtype)
    ref = fused.silu_mul(gate_up, row_scale_of=h, eps=1e-6)
    out = torch.full((tokens, inner), float("nan"), dtype=dtype)
    fused.launch_act_mul(gate_up, out, "silu", h, 1e-6, block=256)
    return close(out, ref, dtype)


def main() -> int:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from triton_interpreted import patch_interpreter

    patch_interpreter()
    failed = 0
    cases = [("qk", (5, 4, 2, 16, 80, "rms", 2)), ("qk", (3, 4, 2, 16, 300, None, 4)),
             ("qk", (9, 2, 1, 8, 64, "rms", 8)), ("act", (3, 300, 80)), ("act", (2, 64, 1500))]
    for dtype in (torch.float32, torch.float16):
        for kind, args in cases:
            ok = qk_case(*args, dtype) if kind == "qk" else act_case(*args, dtype)
            failed += not ok
            print(f"{kind} {args} {dtype}: {'ok' if ok else 'FAIL'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
