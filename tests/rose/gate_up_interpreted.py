"""rose.layers.gate_up_act under Triton's interpreter (TRITON_INTERPRET=1, numpy on the CPU) against the unfused
path's rounding steps computed in float64; run by test_rose_gate_up_act.py in a process of its own (the
interpreter is chosen when the kernel module is imported). Prints one line per case and exits 1 on a mismatch."""

from __future__ import annotations

import dataclasses
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"


def reference(x, weight):
    """SiLU(gate) * up as the unfused path rounds it: each product rounded to x's dtype, SiLU rounded, the product
    rounded; the sums in float64."""
    import torch

    inner, dt = weight.shape[0] // 2, x.dtype
    gate_up = (x.double() @ weight.double().t()).to(dt).float()
    gate, up = gate_up[:, :inner], gate_up[:, inner:]
    return ((gate / (1.0 + torch.exp(-gate))).to(dt).float() * up).to(dt)


def check(m: int, inner: int, k: int, dtype, config, label: str) -> bool:
    import torch

    from rose.layers.gate_up_act import gate_up_silu

    g = torch.Generator().manual_seed(m * 31 + inner)
    x = torch.randn(m, k, generator=g).to(dtype)
    weight = (torch.randn(2 * inner, k, generator=g) * 0.3).to(dtype)
    got = gate_up_silu(x, weight, config)
    want = reference(x, weight)
    # a rounding step of each value, about (float32: tl.dot's default TF32 inputs, 10 bits of mantissa)
    eps = torch.finfo(dtype).eps if dtype != torch.float32 else 2.0 ** -10
    off = (got.float() - want.float()).abs() / (eps * want.float().abs().clamp_min(1e-3))
    ok = (got.shape == (m, inner) and got.dtype == dtype and float(off.max()) <= 4
          and float((off > 1).float().mean()) <= 0.01)
    print(f"gate_up_silu {label} m={m} {dtype}: max {float(off.max()):.2f} steps {'ok' if ok else 'MISMATCH'}")
    return ok


def main() -> int:
    import torch

    from rose.layers.gate_up_act import GateUpConfig

    small = GateUpConfig(block_m=16, block_n=16, block_k=16, warps=1, stages=1, group_m=2)
    wide = GateUpConfig(block_m=32, block_n=32, block_k=32, warps=1, stages=1, group_m=1)
    configs = [small, wide, dataclasses.replace(small, load="tma"), dataclasses.replace(small, load="tma-sms")]
    failed = 0
    for dtype in (torch.float32, torch.float16):
        for m in (1, 37, 70):  # one row, rows past a block, several row groups (group_m 2: a partial last group)
            for config in configs:
                failed += not check(m, 64, 64, dtype, config, config.label())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
