"""ROSE's Triton attention compiles for the GPUs it may meet, within each one's shared memory, without a GPU.

`triton.compile` for a target (Triton's own ptxas): Ampere (sm80), the 100 KB-per-block parts (sm86, whose
limit and blocks sm89's L4 and RTX 40xx share) and Hopper (sm90), at head dims 128 and 256: every block size
`block_config` picks for that target (short, long and many sequences, causal or not, by pointers or descriptors,
two query heads of a KV group a program), the one with the most shared memory in
the kernel's plain, windowed and biased modes, and on Hopper the plain and windowed ones with K and V through
tensor descriptors too (varlen_attention's `tma`, which a bias turns off). A block size or mode that outgrows a part's shared memory fails here rather than at a
replica's first batch there. Skipped without Triton.
"""

from __future__ import annotations

import importlib.util
import itertools

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton (pip install triton)")

SHARED_PER_BLOCK = {80: 163 * 1024, 86: 99 * 1024, 90: 227 * 1024}  # opt-in maxima, bytes (sm89's as sm86's)
SIGNATURE = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "O": "*bf16", "CU": "*i32", "BIAS": "*fp32", "scale_log2": "fp32",
             **{name: "i32" for name in ("stride_qt", "stride_qh", "stride_kt", "stride_kh", "stride_vt", "stride_vh",
                                         "stride_ot", "stride_oh", "M_BLOCKS", "window")}}


@pytest.mark.parametrize("capability", sorted(SHARED_PER_BLOCK))
@pytest.mark.parametrize("head_dim", [128, 256])
def test_kernel_fits_shared_memory(capability, head_dim):
    import triton
    from triton.backends.compiler import GPUTarget

    from rose.attention import triton_blocks, triton_varlen

    configs = sorted({(*blocks[:4], blocks.pack)
                      for bound, seqs in ((128, 1), (512, 1), (512, 100), (4096, 1), (8192, 1), (8192, 8))
                      for causal, tma, group in itertools.product((True, False), (False, True), (2, 4))  # any env
                      if (blocks := triton_blocks.block_config(head_dim, bound, seqs, (capability // 10,
                                                                                       capability % 10),
                                                               causal, tma, group=group, pack=True))},
                     key=lambda c: c[0] * c[4] * c[1] * c[3], reverse=True)  # the most shared memory first
    modes = [(False, False, True), (True, False, False), (False, True, True)]  # plain (split), windowed, biased
    for i, (block_m, block_n, warps, stages, pack) in enumerate(configs):
        for (windowed, biased, split), tma in itertools.product(modes if i == 0 else modes[:1],  # every mode at
                                                                (False, True) if capability == 90 else (False,)):
            if tma and biased:  # varlen_attention loads pointers where a bias is given
                continue
            constexprs = {"GROUP": max(2, pack), "HEAD_DIM": head_dim, "BLOCK_M": block_m,  # the largest
                          "BLOCK_N": block_n,
                          "CAUSAL": not biased, "WINDOWED": windowed, "BIASED": biased,
                          "MAX_DISTANCE": 128 if biased else 0, "SPLIT": split, "TMA": tma, "PACK": pack,
                          "LONGEST_FIRST": i % 2 == 1}  # (the programs' order: both compile)
            kv = dict.fromkeys(("K", "V"), f"tensordesc<bf16[{block_n}, {head_dim}]>") if tma else {}
            source = triton.compiler.ASTSource(fn=triton_varlen._attention_kernel, constexprs=constexprs,
                                               signature={**SIGNATURE, **kv, **dict.fromkeys(constexprs, "constexpr")})
            kernel = triton.compile(source, target=GPUTarget("cuda", capability, 32),
                                    options={"num_warps": warps, "num_stages": stages})
            assert kernel.metadata.shared <= SHARED_PER_BLOCK[capability], (block_m, block_n, windowed, biased,
                                                                            split, tma, kernel.metadata.shared)
    assert (128, 128, 8, 3, 1) in configs if capability == 90 and head_dim <= 128 else len(configs) <= 2
    assert ((32, 64, 4, 3, 2) in configs) == (capability == 90 and head_dim == 128)  # two query heads a program
    assert ((16, 64, 4, 3, 4) in configs) == (capability == 90 and head_dim == 128)  # four (groups of 4)
