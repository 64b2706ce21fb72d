"""ROSE's Triton ragged attention (rose.attention.triton_varlen) on a CPU, under Triton's interpreter.

The same kernel runs compiled on the GPU in test_rose_attention_backends.py (ragged padded batches, graph replays of
new batches) and test_rose_backend_parity_gpu.py (the whole model against transformers). Here: the interpreter
(numpy) in a process of its own, float32 and float16, causal and not, GQA, strided K/V views, max-seqlen bounds
above the longest sequence, sliding windows (narrower and wider than a key block, zero, wider than every sequence)
both ways, MPNet's position bias (reach under and over a sequence's length), and K and V loaded through tensor
descriptors (with rows of NaN past the last sequence, which a descriptor's block reads and the kernel must not use),
and both query heads of a KV group in one program (pack 2); at head dim 128, block_config's own choice (descriptors,
two query heads a program at groups of 2 and 4, pointers where no descriptor can cover K and V), and four query
heads a program (pack 4); programs launched heads fastest and query blocks slowest (longest_first: ragged, packed
through descriptors, windowed, biased). Skipped where Triton is not installed (CPU builds of torch ship without it;
`pip install triton` to run it).
"""

from __future__ import annotations

import pytest

from tests.rose.interpreter import needs_triton, run_interpreted


@needs_triton
def test_kernel_matches_float32_reference_under_the_interpreter():
    run_interpreted("triton_interpreted.py", cases=124)


def test_block_config_follows_the_layout(monkeypatch):
    """Blocks per layout (max-seqlen bound, sequence count, causal, query heads per KV head, GPU), as swept at
    head dim 128: by pointers (the H200) 128 x 128 for long sequences on Hopper only, 64 x 32 for many short ones,
    64 x 64 else and at other head dims; through descriptors (an H100) 64 x 64 and 64 x 32 on Hopper at head dim
    128 past a bound of 128, except bidirectional at 4096 and many sequences at 2048 or more, and with pack causal
    with an even group two query heads a program of 32 x 64 blocks each; the unmasked key blocks split off above a bound
    of 128; head dims above 128 stay at 64 x 64 with 2 stages."""
    from rose.attention import triton_blocks
    from rose.attention.triton_blocks import block_config

    monkeypatch.setattr(triton_blocks, "TMA", None)  # the defaults, whatever this process's environment says
    monkeypatch.setattr(triton_blocks, "PACK", False)
    hopper, ampere = (9, 0), (8, 6)
    assert block_config(128, 128, 1, hopper) == (64, 64, 4, 3, False, False, 1)
    assert block_config(128, 512, 1, hopper) == (64, 64, 4, 3, True, True, 1)
    assert block_config(128, 512, 100, hopper) == (64, 32, 4, 3, True, True, 1)
    assert block_config(128, 512, 100, hopper, causal=False) == (64, 32, 4, 3, True, True, 1)
    assert block_config(128, 4096, 1, hopper) == (64, 64, 4, 3, True, True, 1)
    assert block_config(128, 8192, 1, hopper) == (128, 128, 8, 3, True, False, 1)  # over 4096: unmeasured, pointers
    assert block_config(128, 2048, 1, hopper, causal=False) == (64, 64, 4, 3, True, True, 1)
    assert block_config(128, 4096, 1, hopper, causal=False) == (128, 128, 8, 3, True, False, 1)
    assert block_config(128, 4096, 8, hopper) == (128, 128, 8, 3, True, False, 1)  # unmeasured through descriptors
    assert block_config(128, 4096, 1, ampere) == (64, 64, 4, 3, True, False, 1)
    assert block_config(256, 4096, 1, hopper) == (64, 64, 4, 2, True, False, 1)
    assert block_config(32, 512, 100, hopper) == (64, 64, 4, 3, True, False, 1)  # MiniLM: as swept at head dim 128 only
    assert block_config(64, 4096, 1, hopper) == (64, 64, 4, 3, True, False, 1)
    # the pointer form's blocks where descriptors cannot serve (ROSE_TRITON_ATTENTION_TMA=0, or none for the tensors)
    assert block_config(128, 512, 1, hopper, tma=False) == (64, 64, 4, 3, True, False, 1)
    assert block_config(128, 512, 100, hopper, tma=False) == (64, 32, 4, 3, True, False, 1)
    assert block_config(128, 4096, 1, hopper, tma=False) == (128, 128, 8, 3, True, False, 1)
    # causal GQA through descriptors with pack (ROSE_TRITON_ATTENTION_PACK=1): two query heads of a KV group a
    # program, 32 x 64 blocks each; off by default
    assert block_config(128, 4096, 1, hopper, group=2) == (64, 64, 4, 3, True, True, 1)
    assert block_config(128, 4096, 1, hopper, group=2, pack=True) == (32, 64, 4, 3, True, True, 2)
    assert block_config(128, 512, 100, hopper, group=4, pack=True) == (32, 64, 4, 3, True, True, 2)
    assert block_config(128, 4096, 1, hopper, group=4, pack=True) == (16, 64, 4, 3, True, True, 4)  # the 4B's
    assert block_config(128, 1024, 1, hopper, group=4, pack=True) == (32, 64, 4, 3, True, True, 2)
    assert block_config(128, 512, 1, hopper, group=3, pack=True) == (64, 64, 4, 3, True, True, 1)  # 2 does not divide 3
    assert block_config(128, 512, 1, hopper, causal=False, group=2, pack=True) == (64, 64, 4, 3, True, True, 1)
    assert block_config(128, 128, 1, hopper, group=2, pack=True) == (64, 64, 4, 3, False, False, 1)
    assert block_config(128, 4096, 8, hopper, group=2, pack=True) == (128, 128, 8, 3, True, False, 1)
    assert block_config(128, 4096, 1, hopper, tma=False, group=2, pack=True) == (128, 128, 8, 3, True, False, 1)
    # forced through descriptors: the measured blocks where there are some, else the pointer form's
    assert block_config(128, 128, 1, hopper, tma=True) == (64, 64, 4, 3, False, True, 1)
    assert block_config(32, 512, 100, hopper, tma=True) == (64, 64, 4, 3, True, True, 1)


def test_longest_first_for_up_to_four_long_causal_sequences(monkeypatch):
    """Heads fastest, query blocks slowest for one to four causal sequences above a bound of 512 (where the H100
    sweeps found it faster); more sequences, bidirectional layouts and short bounds keep each head's blocks together;
    the setting forces either."""
    from rose.attention import triton_blocks
    from rose.attention.triton_blocks import longest_first

    monkeypatch.setattr(triton_blocks, "LONGEST_FIRST", None)  # auto, whatever this process's environment says
    assert longest_first(4096, 1, True) and longest_first(1024, 1, True) and longest_first(513, 1, True)
    assert not longest_first(512, 1, True) and not longest_first(128, 1, True)
    assert longest_first(4096, 2, True) and longest_first(2048, 4, True) and longest_first(1024, 4, True)
    assert not longest_first(4096, 5, True) and not longest_first(512, 4, True) and not longest_first(512, 51, True)
    assert not longest_first(4096, 1, False)
    monkeypatch.setattr(triton_blocks, "LONGEST_FIRST", True)
    assert longest_first(512, 51, False)
    monkeypatch.setattr(triton_blocks, "LONGEST_FIRST", False)
    assert not longest_first(4096, 1, True)


def test_settings_read_auto_on_off():
    """The auto / on / off reader of ROSE_TRITON_ATTENTION_TMA (auto by default) and _PACK (0 by default; auto is
    off there): None for auto and for anything unreadable (with a warning naming the variable); 1 / 0."""
    from rose.attention.triton_blocks import _setting

    name = "ROSE_TRITON_ATTENTION_TMA"
    assert _setting(name, "auto") is None and _setting(name, "") is None
    assert _setting(name, "1") is True and _setting(name, " On ") is True
    assert _setting(name, "0") is False and _setting(name, "off") is False
    with pytest.warns(UserWarning, match="ROSE_TRITON_ATTENTION_PACK='maybe'"):
        assert _setting("ROSE_TRITON_ATTENTION_PACK", "maybe") is None


def test_a_scale_that_is_not_positive_is_refused():
    """The kernel scales each row's max of the raw scores (one FMA in the exponent), which holds for a positive
    scale only: anything else is refused before a launch."""
    import torch

    from rose.attention.triton_varlen import varlen_attention

    q = k = v = torch.zeros(4, 2, 32)
    cu = torch.tensor([0, 4], dtype=torch.int32)
    for scale in (0.0, -0.17, float("nan")):
        with pytest.raises(ValueError, match="scale must be positive"):
            varlen_attention(q, k, v, cu, 4, True, scale)
