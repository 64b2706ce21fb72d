"""What the edges between a small batch's graph nodes cost, and what weights already in L2 would change:
Qwen3-0.6B's layer kernels at 128 tokens, as CUDA-graph replays. On the GPU:

    python -m benchmarks.kernel_edges [--tokens 128] [--json FILE]

Rows, µs per replay (median), 28 layers with weights of their own unless 'hot':
- norms: 252 add+RMSNorm kernels back to back (rose.layers.fused): a small kernel and its edge
- layers: a decoder layer's nine kernels x 28 (add+RMSNorm, QKV GEMM, QK-norm+RoPE, attention, O GEMM,
  add+RMSNorm, gate-up GEMM, SiLU*mul, down GEMM): the model's GPU time less embedding and pooling
- gemms: the 112 GEMMs alone; hot: one layer's weights every time (L2 holds them): what prefetching could win
- gemms + prefetch: the cold GEMMs with the next GEMM's weight prefetched into L2 on a side stream meanwhile
  (`line`: prefetch.global.L2::evict_last per 128-byte line; `bulk`: cp.async.bulk.prefetch.L2 per 4 KiB)
Prints one table last. (Programmatic dependent launch was measured with this script at cce8f5a, whose kernels
had it: benchmarks/NOTES.md, "Kernel edges".)
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from benchmarks import gpu_env
from rose.attention.triton_varlen import varlen_attention
from rose.layers import fused

LAYERS, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER = 28, 1024, 16, 8, 128, 3072
SHAPES = {"qkv": ((HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN), "o": (HIDDEN, HEADS * HEAD_DIM),
          "gate_up": (2 * INTER, HIDDEN), "down": (HIDDEN, INTER)}


@triton.jit
def _prefetch_lines(ptr, lines, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.inline_asm_elementwise("prefetch.global.L2::evict_last [$1]; mov.u32 $0, 0;", "=r,l",
                              [ptr + tl.where(i < lines, i, 0).to(tl.int64) * 64], dtype=tl.int32, is_pure=False,
                              pack=1)


@triton.jit
def _prefetch_bulk(ptr, chunks, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0;", "=r,l,r",
                              [ptr + tl.where(i < chunks, i, 0).to(tl.int64) * 2048, tl.full([BLOCK], 4096, tl.int32)],
                              dtype=tl.int32, is_pure=False, pack=1)


def prefetch(w: torch.Tensor, how: str) -> None:
    if how == "line":
        lines = w.numel() * 2 // 128
        _prefetch_lines[(triton.cdiv(lines, 1024),)](w, lines, BLOCK=1024)
    else:
        chunks = w.numel() * 2 // 4096
        _prefetch_bulk[(triton.cdiv(chunks, 128),)](w, chunks, BLOCK=128)


def median_us(fn) -> float:
    fn()
    torch.cuda.synchronize()
    return triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median") * 1e3


class Layers:
    """28 layers of the 0.6B's weights (or one layer's, `hot`) and the activations of `tokens` tokens."""

    def __init__(self, tokens: int, hot: bool = False):
        g = torch.Generator("cuda").manual_seed(0)
        rand = lambda *shape: torch.randn(*shape, device="cuda", generator=g).bfloat16() * 0.02  # noqa: E731
        layer = lambda: {name: rand(*shape) for name, shape in SHAPES.items()}  # noqa: E731
        self.weights = [layer()] * LAYERS if hot else [layer() for _ in range(LAYERS)]
        self.x = {k: rand(tokens, k) for k in (HIDDEN, HEADS * HEAD_DIM, INTER)}
        self.norm_w = (1 + rand(HIDDEN))
        self.qk_w = 1 + rand(HEAD_DIM)
        self.positions = torch.arange(tokens, device="cuda")
        self.inv_freq = 1e6 ** (-torch.arange(0, HEAD_DIM, 2, device="cuda").float() / HEAD_DIM)
        self.cu = torch.tensor([0, tokens], dtype=torch.int32, device="cuda")
        self.tokens = tokens
        self.side = torch.cuda.Stream()

    def gemm_inputs(self):
        return {"qkv": self.x[HIDDEN], "o": self.x[HEADS * HEAD_DIM], "gate_up": self.x[HIDDEN], "down": self.x[INTER]}

    def gemms(self, how: str | None = None) -> None:
        order = [(w[name], name) for w in self.weights for name in SHAPES]
        inputs = self.gemm_inputs()
        main = torch.cuda.current_stream()
        for i, (w, name) in enumerate(order):
            if how and i + 1 < len(order):
                self.side.wait_stream(main)
                with torch.cuda.stream(self.side):
                    prefetch(order[i + 1][0], how)
            F.linear(inputs[name], w)
            if how and i + 1 < len(order):
                main.wait_stream(self.side)

    def norms(self) -> None:
        x, r = self.x[HIDDEN], self.x[HIDDEN]
        for _ in range(LAYERS * 9):
            fused.add_rms_norm(x, r, self.norm_w, 1e-6)

    def layers(self) -> None:
        h = r = self.x[HIDDEN]
        for w in self.weights:
            normed, r = fused.add_rms_norm(h, r, self.norm_w, 1e-6)
            qkv = F.linear(normed, w["qkv"])
            q, k = fused.qk_norm_rope(qkv, self.qk_w, self.qk_w, self.positions, self.inv_freq, HEADS, KV_HEADS,
                                      HEAD_DIM, 1e-6)
            v = qkv[:, (HEADS + KV_HEADS) * HEAD_DIM:].view(self.tokens, KV_HEADS, HEAD_DIM)
            attn = varlen_attention(q, k, v, self.cu, self.tokens, True, HEAD_DIM ** -0.5)
            h = F.linear(attn.view(self.tokens, -1), w["o"])
            normed, r = fused.add_rms_norm(h, r, self.norm_w, 1e-6)
            h = F.linear(fused.silu_mul(F.linear(normed, w["gate_up"])), w["down"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--json", default="")
    args = parser.parse_args(argv)
    cold, hot = Layers(args.tokens), Layers(args.tokens, hot=True)
    rows: dict[str, list[float] | str] = {}
    for _ in range(2):  # each twice, side by side
        for name, fn in (("norms", cold.norms), ("layers", cold.layers)):
            rows.setdefault(name, []).append(round(median_us(fn), 1))  # type: ignore[union-attr]
    rows["gemms cold"] = [round(median_us(cold.gemms), 1)]
    rows["gemms hot"] = [round(median_us(hot.gemms), 1)]
    for how in ("line", "bulk"):
        try:
            rows[f"gemms + prefetch {how}"] = [round(median_us(lambda how=how: cold.gemms(how)), 1)]
        except Exception as exc:  # an instruction this toolchain refuses: reported, the rest still runs
            rows[f"gemms + prefetch {how}"] = f"failed: {type(exc).__name__}: {str(exc)[:200]}"
    out = {"env": gpu_env.collect(), "tokens": args.tokens, "us": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    print(f"kernel edges at {args.tokens} tokens, µs per replay (median; repeated runs side by side)")
    for name, value in rows.items():
        print(f"  {name:24s} {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
