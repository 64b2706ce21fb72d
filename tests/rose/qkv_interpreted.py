"""rose.layers.qkv_norm_rope under Triton's interpreter (TRITON_INTERPRET=1, numpy on the CPU) against the unfused
path: the QKV product in float64 rounded to the activations' dtype, then the layers' QK-norm+RoPE kernel
(rose.layers.fused.launch_qk_norm_rope, interpreted too) on it, v the product's last columns: within rounding steps
on random operands, and the same bits on small integers (products exact in any order). Run by
test_rose_qkv_norm_rope.py in a process of its own (the interpreter is chosen when a kernel module is imported).
Prints one line per case and exits 1 on a mismatch."""

from __future__ import annotations

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"


def check(m: int, dtype, norm: str | None, label: str, heads: int = 4, kv_heads: int = 2, d: int = 32,
          k: int = 128) -> bool:
    import torch

    from rose.layers.fused import launch_qk_norm_rope
    from rose.layers.qkv_norm_rope import qkv_norm_rope

    g = torch.Generator().manual_seed(m * 31 + heads)
    x = torch.randn(m, k, generator=g).to(dtype)
    weight = (torch.randn((heads + 2 * kv_heads) * d, k, generator=g) * 0.3).to(dtype)
    q_w, k_w = (torch.rand(d, generator=g) + 0.5).to(dtype), (torch.rand(d, generator=g) + 0.5).to(dtype)
    positions = torch.randint(0, 5000, (m,), generator=g)  # angles far from 0: cos and sin rounded as the layers do
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    got = qkv_norm_rope(x, weight, q_w, k_w, positions, inv_freq, heads, kv_heads, 1e-6, norm)
    qkv = (x.double() @ weight.double().t()).to(dtype)
    want_q = torch.empty(m, heads, d, dtype=dtype)
    want_k = torch.empty(m, kv_heads, d, dtype=dtype)
    launch_qk_norm_rope(qkv, want_q, want_k, q_w, k_w, positions, inv_freq, 1e-6, norm=norm)
    want_v = qkv[:, (heads + kv_heads) * d:].reshape(m, kv_heads, d)
    # rounding steps of each value, at least of its head's RMS (float32: tl.dot's default TF32 inputs, 10 bits of
    # mantissa): a product a step apart moves the normed, rotated value by a few, and a rotation that cancels
    # leaves a small value with its operands' rounding
    eps = torch.finfo(dtype).eps if dtype != torch.float32 else 2.0 ** -10
    worst, share = 0.0, 0.0
    for a, b in zip(got, (want_q, want_k, want_v), strict=True):
        if a.shape != b.shape or a.dtype != dtype or not a.is_contiguous():
            print(f"qkv_norm_rope {label}: shape {tuple(a.shape)} {a.dtype} against {tuple(b.shape)} MISMATCH")
            return False
        scale = torch.maximum(b.float().abs(), b.float().pow(2).mean(-1, keepdim=True).sqrt())
        off = (a.float() - b.float()).abs() / (eps * scale.clamp_min(1e-3))
        worst, share = max(worst, float(off.max())), max(share, float((off > 1).float().mean()))
    ok = worst <= 4 and share <= 0.01
    print(f"qkv_norm_rope {label} m={m} {dtype}: max {worst:.2f} steps, {share:.4f} over one "
          f"{'ok' if ok else 'MISMATCH'}")
    return ok


def check_exact(m: int, norm: str | None, label: str, heads: int = 4, kv_heads: int = 2, d: int = 32,
                k: int = 128) -> bool:
    """float16 operands of small integers, whose products are exact in any summation order: the epilogue's every
    rounding step (the product, the normed value, the weight's product, cos and sin, the rotation) must give the
    unfused kernel's bits."""
    import torch

    from rose.layers.fused import launch_qk_norm_rope
    from rose.layers.qkv_norm_rope import qkv_norm_rope

    g = torch.Generator().manual_seed(m * 17 + 1)
    x = torch.randint(-2, 3, (m, k), generator=g).half()
    weight = torch.randint(-2, 3, ((heads + 2 * kv_heads) * d, k), generator=g).half()
    q_w, k_w = (torch.rand(d, generator=g) + 0.5).half(), (torch.rand(d, generator=g) + 0.5).half()
    positions = torch.randint(0, 5000, (m,), generator=g)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    got = qkv_norm_rope(x, weight, q_w, k_w, positions, inv_freq, heads, kv_heads, 1e-6, norm)
    qkv = (x.double() @ weight.double().t()).half()  # exact: integers under 2048
    want_q, want_k = torch.empty(m, heads, d, dtype=torch.half), torch.empty(m, kv_heads, d, dtype=torch.half)
    launch_qk_norm_rope(qkv, want_q, want_k, q_w, k_w, positions, inv_freq, 1e-6, norm=norm)
    want_v = qkv[:, (heads + kv_heads) * d:].reshape(m, kv_heads, d)
    apart = [int((a != b).sum()) for a, b in zip(got, (want_q, want_k, want_v), strict=True)]
    ok = apart == [0, 0, 0]
    print(f"qkv_norm_rope exact {label} m={m}: elements apart (q, k, v) {apart} {'ok' if ok else 'MISMATCH'}")
    return ok


def main() -> int:
    import torch

    failed = 0
    for dtype in (torch.float32, torch.float16):
        for m in (1, 37, 130):  # one row, rows past a block, a second row block (partial)
            for norm in ("rms", None):
                failed += not check(m, dtype, norm, f"norm={norm}")
    failed += not check(70, torch.float16, "rms", "groups of 4 KV heads, d 64", heads=8, kv_heads=2, d=64, k=64)
    failed += not check_exact(130, "rms", "norm=rms") + (not check_exact(37, None, "norm=None"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
