"""rose.attention.triton_varlen under Triton's interpreter (TRITON_INTERPRET=1, numpy on the CPU) against float32 SDPA
per sequence; run by test_rose_triton_attention.py in a process of its own (the interpreter is chosen when the
kernel module is imported). Prints one line per case and exits 1 on a mismatch."""

from __future__ import annotations

import os
import sys
from functools import partial

os.environ["TRITON_INTERPRET"] = "1"


def patch_interpreter() -> None:
    """Triton 3.6's interpreter takes int() of a loaded scalar, a 1-element array, which numpy 2 refuses (a
    loop bound read from memory, as cu_seqlens is here); index its one element instead."""
    from triton.runtime import interpreter

    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None:  # a Triton whose interpreter is laid out otherwise: run it as it is
        return

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patched


def reference(q, k, v, lengths, causal, scale, window=-1, bias=None):
    """float32 SDPA per sequence; a window keeps keys at most `window` positions from the query (-1: all); bias
    [heads, 2D + 1] is added by key - query position, clamped to [-D, D]."""
    import torch
    import torch.nn.functional as F

    out, at, group = torch.zeros(q.shape, dtype=torch.float32), 0, q.shape[1] // k.shape[1]
    for n in lengths:
        qs, ks, vs = (x[at:at + n].float().transpose(0, 1)[None] for x in (q, k, v))
        ks, vs = (x.repeat_interleave(group, dim=1) for x in (ks, vs))
        gap = torch.arange(n)[:, None] - torch.arange(n)[None, :]
        allowed = torch.ones(n, n, dtype=torch.bool) if window < 0 else gap.abs() <= window
        if causal:
            allowed &= gap >= 0
        mask = torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))[None]
        if bias is not None:
            reach = bias.shape[1] // 2
            mask = mask + bias[:, (-gap).clamp(-reach, reach) + reach]  # [heads, n, n]: key - query = -gap
        out[at:at + n] = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask[None], scale=scale)[0].transpose(0, 1)
        at += n
    return out


def check(varlen_attention, dtype, bar: float, causal: bool, lengths: list[int], bound: int, label: str,
          config=None, window: int = -1, reach: int = 0, split: bool = True, tma: bool = False,
          longest_first: bool = False, poison: int = 0) -> bool:
    """One case: random q and strided k/v views (as the fused QKV projection's) of 4 query / 2 KV heads of 32, a
    random float32 bias table [4, 2 * reach + 1] when reach; split=False masks every key block (the kernel's
    split into unmasked and masked blocks off); prints a line and says whether it passed."""
    import torch

    tokens, hq, hk, d = sum(lengths), 4, 2, 32
    q = torch.randn(tokens + poison, hq, d, dtype=dtype)
    kv = torch.randn(tokens + poison, 2 * hk, d, dtype=dtype)
    kv[tokens:] = float("nan")  # rows in no sequence that nobody wrote (a layout's padding): never to be read
    k, v = kv[:, :hk], kv[:, hk:]
    bias = torch.randn(hq, 2 * reach + 1) * 2 if reach else None  # float32, as the kernel takes it
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    out = varlen_attention(q, k, v, cu, bound, causal, d ** -0.5, config, window=window, position_bias=bias,
                           split=split, tma=tma, longest_first=longest_first)[:tokens]
    err = float((out.float() - reference(q, k, v, lengths, causal, d ** -0.5, window, bias)[:tokens]).abs().max())
    ok = err <= bar  # a NaN or inf anywhere fails this too
    print(f"{dtype!s:14s} {label} {lengths} bound {bound}: max abs err {err:.2e} {'ok' if ok else 'FAILED'}")
    return ok


def check_blocks(varlen_attention, causal: bool, heads: tuple[int, int, int], lengths: list[int], bound: int,
                 label: str, rows_apart: bool = False, config: tuple[int, ...] | None = None) -> bool:
    """One float32 case with block_config's own choice (or `config`; tma None) at heads (Hq, Hkv, D); rows_apart:
    K and V with their heads not contiguous in a row (no descriptors can cover them: the pointer form's blocks)."""
    import torch

    tokens, (hq, hk, d) = sum(lengths), heads
    q = torch.randn(tokens, hq, d)
    kv = torch.randn(tokens, d, 2 * hk).transpose(1, 2) if rows_apart else torch.randn(tokens, 2 * hk, d)
    k, v = kv[:, :hk], kv[:, hk:]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    from rose.attention.triton_blocks import block_config

    # what runs (descriptors permitting)
    blocks = config or tuple(block_config(d, bound, len(lengths), (9, 0), causal, group=hq // hk))
    out = varlen_attention(q, k, v, cu, bound, causal, d ** -0.5, config)
    err = float((out - reference(q, k, v, lengths, causal, d ** -0.5)).abs().max())
    ok = err <= 1e-5
    print(f"float32 causal={causal!s:5s} {label} {blocks} {lengths} bound {bound}: max abs err {err:.2e} "
          f"{'ok' if ok else 'FAILED'}")
    return ok


def main() -> int:
    patch_interpreter()
    import torch

    from rose.attention.triton_varlen import varlen_attention

    torch.manual_seed(0)
    # (lengths, max-seqlen bound, block config): ragged with a 1-token sequence; one sequence over several
    # query blocks; a bound four times the longest (a graph layout's); query blocks ending mid-sequence; the
    # same on 128 x 128 blocks and 32-key blocks (block_config's for long sequences and for many short ones)
    cases = (([37, 1, 200, 64], 256, None), ([300], 300, None), ([5, 70, 3], 280, None), ([65, 129], 129, None),
             ([300, 7], 300, (128, 128, 8, 3)), ([65, 129], 129, (64, 32, 4, 3)), ([64, 128, 63], 128, None))
    # sliding windows (lengths, bound, window): narrower than a key block (whole blocks outside some rows'
    # windows), wider than one, zero (each query its own key), wider than every sequence
    windows = (([37, 1, 200, 64], 256, 5), ([300], 300, 70), ([65, 129], 129, 0), ([5, 70, 3], 280, 500))
    # a position bias (MPNet's, by key - query position, past +-reach the edge value): reach under and over a
    # sequence's length, an asymmetric table
    biased = (([37, 1, 200, 64], 256, 16), ([300], 300, 128))
    results = []
    for dtype, bar in ((torch.float32, 1e-5), (torch.float16, 3e-3)):
        for causal in (False, True):
            run = partial(check, varlen_attention, dtype, bar, causal)
            results += [run(lengths, bound, f"causal={causal!s:5s} {config or 'default'}", config)
                        for lengths, bound, config in cases]
            results += [run(lengths, bound, f"causal={causal!s:5s} window {window}", window=window)
                        for lengths, bound, window in windows]
            results += [run(lengths, bound, f"biased reach {reach}", reach=reach)
                        for lengths, bound, reach in (biased if not causal else ())]
            results += [run(lengths, bound, f"causal={causal!s:5s} {config or 'default'} every block masked",
                            config, split=False) for lengths, bound, config in cases[:1] + cases[-2:]]
            # K and V through tensor descriptors: ragged, 128 x 128 and 32-key blocks, a window, a bias, and rows
            # past the last sequence full of NaN (a descriptor's block reads them; the kernel must not use them)
            results += [run(lengths, bound, f"causal={causal!s:5s} {config or 'default'} tma", config, tma=True)
                        for lengths, bound, config in (cases[0], cases[4], cases[5])]
            results.append(run([37, 1, 200, 70], 256, f"causal={causal!s:5s} tma, NaN rows after", tma=True,
                               poison=40))
            results.append(run([37, 1, 200, 64], 256, f"causal={causal!s:5s} window 5 tma", window=5, tma=True))
            if not causal:  # (a bias turns the descriptors off: pointers, the same result)
                results.append(run([37, 1, 200, 64], 256, "biased reach 16 tma", reach=16, tma=True))
            # both query heads of a KV group in one program (pack 2): ragged, 32-row blocks over a long sequence,
            # through descriptors with NaN rows after, a window, a bias (each row its own head's table)
            pack, pack32 = (64, 64, 4, 3, 2), (32, 64, 4, 3, 2)
            results += [run([37, 1, 200, 64], 256, f"causal={causal!s:5s} {pack}", pack),
                        run([300, 7], 300, f"causal={causal!s:5s} {pack32}", pack32),
                        run([37, 1, 200, 70], 256, f"causal={causal!s:5s} {pack} tma, NaN rows after", pack,
                            tma=True, poison=40),
                        run([37, 1, 200, 64], 256, f"causal={causal!s:5s} {pack} window 5", pack, window=5)]
            if not causal:
                results.append(run([37, 1, 200, 64], 256, f"biased reach 16 {pack}", pack, reach=16))
            # programs launched heads fastest, query blocks slowest (longest_first): ragged, two heads a program
            # through descriptors with NaN rows after, a window, a bias
            results += [run([37, 1, 200, 64], 256, f"causal={causal!s:5s} longest first", longest_first=True),
                        run([37, 1, 200, 70], 256, f"causal={causal!s:5s} {pack} tma longest first", pack,
                            tma=True, poison=40, longest_first=True),
                        run([300], 300, f"causal={causal!s:5s} window 70 longest first", window=70,
                            longest_first=True)]
            if not causal:
                results.append(run([37, 1, 200, 64], 256, "biased reach 16 longest first", reach=16,
                                   longest_first=True))
    # head dim 128, as the Qwen3 models have it: block_config's own choice through descriptors on Hopper (the
    # interpreter's capability), with two query heads a program (pack on) at groups of 2 and 4, and K/V rows that
    # no descriptor can cover
    from rose.attention import triton_blocks

    for causal in (True, False):
        triton_blocks.PACK = True
        results += [check_blocks(varlen_attention, causal, (4, 2, 128), [150, 37], 200, "128 pack, group 2"),
                    check_blocks(varlen_attention, causal, (8, 2, 128), [150, 37], 200, "128 pack, group 4")]
        triton_blocks.PACK = False
        results += [check_blocks(varlen_attention, causal, (8, 2, 32), [150, 37], 200, "pack 4, group 4",
                                 config=(16, 64, 4, 3, 4)),
                    check_blocks(varlen_attention, causal, (4, 2, 128), [150, 37], 200, "128 descriptors"),
                    check_blocks(varlen_attention, causal, (4, 2, 128), [150, 37], 200, "128 rows apart",
                                 rows_apart=True)]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
