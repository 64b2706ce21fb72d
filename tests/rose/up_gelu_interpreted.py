"""rose.layers.up_gelu under Triton's interpreter (TRITON_INTERPRET=1, numpy on the CPU) against the unfused path's
rounding steps computed in float64 (the linear's output with its bias rounded to the dtype, GELU rounded); run by
test_rose_up_gelu.py in a process of its own. Prints one line per case and exits 1 on a mismatch."""

from __future__ import annotations

import dataclasses
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"


def reference(x, weight, bias):
    import torch

    y = (x.double() @ weight.double().t() + bias.double()).to(x.dtype)
    return torch.nn.functional.gelu(y.double()).to(x.dtype)


def check(m: int, inner: int, k: int, dtype, config) -> bool:
    import torch

    from rose.layers.up_gelu import up_gelu

    g = torch.Generator().manual_seed(m * 17 + inner)
    x = torch.randn(m, k, generator=g).to(dtype)
    weight = (torch.randn(inner, k, generator=g) * 0.3).to(dtype)
    bias = torch.randn(inner, generator=g).to(dtype)
    got = up_gelu(x, weight, bias, config)
    want = reference(x, weight, bias)
    # a rounding step of each value, about (float32: tl.dot's default TF32 inputs, 10 bits of mantissa)
    eps = torch.finfo(dtype).eps if dtype != torch.float32 else 2.0 ** -10
    off = (got.float() - want.float()).abs() / (eps * want.float().abs().clamp_min(1e-2))
    ok = (got.shape == (m, inner) and got.dtype == dtype and float(off.max()) <= 4
          and float((off > 1).float().mean()) <= 0.01)
    print(f"up_gelu {config.label()} m={m} {dtype}: max {float(off.max()):.2f} steps {'ok' if ok else 'MISMATCH'}")
    return ok


def main() -> int:
    import torch

    from rose.layers.gate_up_act import GateUpConfig

    small = GateUpConfig(block_m=16, block_n=16, block_k=16, warps=1, stages=1, group_m=2)
    wide = GateUpConfig(block_m=32, block_n=32, block_k=32, warps=1, stages=1, group_m=1)
    failed = 0
    for dtype in (torch.float32, torch.float16):
        for m in (1, 37, 70):  # one row, rows past a block, several row groups (group_m 2: a partial last group)
            for config in (small, wide, dataclasses.replace(small, load="tma")):
                failed += not check(m, 64, 96, dtype, config)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
