"""A/B of the Qwen3 QK-norm+RoPE kernel on the GPU: session 2's kernel (one program per token and head)
against rose.layers.fused's (one per block of tokens, all heads), at each tokens-per-program choice.

    python -m benchmarks.qk_rope_ab [--tokens 128,512,4096,25600] [--json out.json]

Each time is the median of CUDA-graph replays (triton.testing.do_bench_cudagraph), as ROSE runs it.
The floor is the bytes one call must move (q and k read from the QKV rows, q and k written) over 4.3 TB/s,
the H200's measured copy bandwidth (KINDS.md). Both kernels must give the same bits; checked first.
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl

from rose.layers import fused

SHAPES = {"qwen3-0.6b": (16, 8, 128), "qwen3-4b": (32, 8, 128)}
COPY_BYTES_PER_S = 4.3e12


@triton.jit
def _session2_kernel(qkv_ptr, q_ptr, k_ptr, qw_ptr, kw_ptr, pos_ptr, inv_freq_ptr, stride,
                     num_heads, num_kv_heads, eps, HALF: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    j = tl.arange(0, HALF)
    src = qkv_ptr + t * stride + head * (2 * HALF)
    x1 = tl.load(src + j).to(tl.float32)
    x2 = tl.load(src + HALF + j).to(tl.float32)
    is_q = head < num_heads
    w1 = tl.where(is_q, tl.load(qw_ptr + j), tl.load(kw_ptr + j)).to(tl.float32)
    w2 = tl.where(is_q, tl.load(qw_ptr + HALF + j), tl.load(kw_ptr + HALF + j)).to(tl.float32)
    rstd = tl.rsqrt((tl.sum(x1 * x1, axis=0) + tl.sum(x2 * x2, axis=0)) / (2 * HALF) + eps)
    dt = q_ptr.dtype.element_ty
    n1 = ((x1 * rstd).to(dt).to(tl.float32) * w1).to(dt).to(tl.float32)
    n2 = ((x2 * rstd).to(dt).to(tl.float32) * w2).to(dt).to(tl.float32)
    freq = tl.load(pos_ptr + t).to(tl.float32) * tl.load(inv_freq_ptr + j)
    c = tl.cos(freq).to(dt).to(tl.float32)
    s = tl.sin(freq).to(dt).to(tl.float32)
    if is_q:
        dst = q_ptr + (t * num_heads + head) * (2 * HALF)
    else:
        dst = k_ptr + (t * num_kv_heads + (head - num_heads)) * (2 * HALF)
    tl.store(dst + j, (n1 * c - n2 * s).to(dt))
    tl.store(dst + HALF + j, (n2 * c + n1 * s).to(dt))


def _median_us(fn) -> float:
    return round(triton.testing.do_bench_cudagraph(fn, rep=50, return_mode="median") * 1e3, 2)


def measure(model: str, t: int, hq: int, hk: int, d: int) -> dict:
    g = torch.Generator("cuda").manual_seed(t)
    qkv = torch.randn(t, (hq + 2 * hk) * d, device="cuda", generator=g).bfloat16()
    qw, kw = (1 + 0.1 * torch.randn(2, d, device="cuda", generator=g)).bfloat16()
    pos = torch.arange(t, device="cuda")
    inv = 1.0 / (1e6 ** (torch.arange(0, d, 2, device="cuda", dtype=torch.float32) / d))
    q, k = torch.empty(t, hq, d, device="cuda", dtype=qkv.dtype), torch.empty(t, hk, d, device="cuda", dtype=qkv.dtype)
    q0, k0 = torch.empty_like(q), torch.empty_like(k)

    def old():
        _session2_kernel[(t, hq + hk)](qkv, q0, k0, qw, kw, pos, inv, qkv.stride(0), hq, hk, 1e-6, HALF=d // 2)

    def new(block=None):
        fused.launch_qk_norm_rope(qkv, q, k, qw, kw, pos, inv, 1e-6, block_tokens=block)

    old(), new()
    torch.cuda.synchronize()
    row = {"model": model, "tokens": t, "same_bits": torch.equal(q, q0) and torch.equal(k, k0),
           "rule_block": fused.qk_block_tokens(t, hq),
           "floor_us": round(2 * t * (hq + hk) * d * 2 / COPY_BYTES_PER_S * 1e6, 2),
           "session2_us": _median_us(old)}
    for block in (1, 2, 4, 8):
        row[f"block{block}_us"] = _median_us(lambda b=block: new(b))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="128,512,4096,25600")
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    rows = []
    for model, (hq, hk, d) in SHAPES.items():
        for t in (int(x) for x in args.tokens.split(",")):
            rows.append(measure(model, t, hq, hk, d))
            print(json.dumps(rows[-1]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    print(f"\n{'model':11s} {'tokens':>6s} {'floor':>7s} {'sess2':>8s} {'b1':>7s} {'b2':>7s} {'b4':>7s} {'b8':>7s}"
          f" rule same-bits (us per call)")
    for r in rows:
        print(f"{r['model']:11s} {r['tokens']:6d} {r['floor_us']:7.2f} {r['session2_us']:8.2f} "
              + " ".join(f"{r[f'block{b}_us']:7.2f}" for b in (1, 2, 4, 8)) + f" {r['rule_block']:4d} {r['same_bits']}")


if __name__ == "__main__":
    main()
