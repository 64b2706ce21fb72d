"""The Triton ragged attention's configuration per graph layout (rose.attention.triton_varlen): block sizes, warps
and stages, the unmasked key blocks split off, K and V through tensor descriptors, and query heads packed a program,
as measured per shape, with the environment's settings that force them (ROSE_TRITON_ATTENTION_TMA, _PACK,
_LONGEST_FIRST), and the order its programs launch in (longest_first)."""

from __future__ import annotations

import os
import warnings
from typing import NamedTuple


def _setting(name: str, value: str) -> bool | None:
    """An auto / on / off environment setting: None for "auto" (block_config's choice), else forced on or off; an
    unreadable value is auto, with a warning (a replica starts)."""
    value = value.strip().lower()
    if value in ("1", "true", "on"):
        return True
    if value in ("0", "false", "off"):
        return False
    if value not in ("", "auto"):
        warnings.warn(f"{name}={value!r} is not auto, 1 or 0: auto", stacklevel=2)
    return None


# read at import: K and V through tensor descriptors (auto); two query heads of a KV group a program where
# block_config's measured shapes allow (1; 0, the default: one query head a program)
TMA = _setting("ROSE_TRITON_ATTENTION_TMA", os.environ.get("ROSE_TRITON_ATTENTION_TMA", "auto"))
PACK = _setting("ROSE_TRITON_ATTENTION_PACK", os.environ.get("ROSE_TRITON_ATTENTION_PACK", "0")) is True
# programs launched heads fastest, query blocks slowest, every head's longest causal blocks first (auto:
# longest_first's choice; 1 / 0 forced)
LONGEST_FIRST = _setting("ROSE_TRITON_ATTENTION_LONGEST_FIRST",
                         os.environ.get("ROSE_TRITON_ATTENTION_LONGEST_FIRST", "auto"))


class Blocks(NamedTuple):
    """A layout's kernel configuration (block_config)."""

    block_m: int
    block_n: int
    warps: int
    stages: int
    split: bool  # the key blocks every row sees run without masks
    tma: bool  # K and V through tensor descriptors
    pack: int = 1  # query heads of one KV group a program (block_m rows each)


def block_config(head_dim: int, max_seqlen: int = 512, seqs: int = 1, capability: tuple[int, int] = (9, 0),
                 causal: bool = True, tma: bool | None = None, group: int = 1, pack: bool | None = None) -> Blocks:
    """The kernel's configuration for a layout: its head dim, max-seqlen bound and sequence count (both fixed per
    graph layout), causal or not, query heads per KV head (group), on a GPU of this capability; tma False: the best
    with pointer loads (no descriptors here), True: through descriptors (forced: tests, sweeps), None: the measured
    choice (TMA's setting); pack: two query heads of a KV group a program where measured (None: PACK's setting).
    The unmasked key blocks split from the masked ones above a bound of 128 (at 1 x 128 the split's second loop
    costs more than its masks save: 6.6 vs 5.4 us). Swept at head dim 128, µs a call in a graph:
    - pointer loads (the H200, `benchmarks.triton_attention_sweep --split`, `results/triton_attention/`): long
      sequences (a bound of 2048 or more) on Hopper 128 x 128, 8 warps, 3 stages (1 x 4096 causal 195 us; 64 x 64
      213); many sequences (more than 4) 64 x 32 (100 mixed documents 140 us; 64 x 64 159); else 64 x 64;
    - through descriptors (an H100, `--tma`, `results/triton_attention_tma_bc9b4c9/`): 64 x 64 above a bound of 128
      up to 4096 causal, below 4096 bidirectional (measured at 512, 1024, 2048 and 4096; 1 x 4096 causal 172.9 us
      against 190.4 for 128 x 128 by pointers and 204.1 for 128 x 128 by descriptors; 1 x 512 10.2 against 11.3), 64
      x 32 for many sequences (100 documents 137.4 against 144.1 causal, 166.8 against 194.7 bidirectional); not at
      1 x 128 (5.64 against 5.36) nor bidirectional at 4096 (128 x 128 by pointers 285.0 stays the best); many
      sequences with a bound of 2048 or more and bounds over 4096 unmeasured (pointers);
    - two query heads of a KV group a program, 32 x 64 blocks each (an H100, `--tma --wide`,
      `results/triton_attention_tma_f05a4ea/`), the best causal shape through descriptors at every bound from 512
      (1 x 4096 172.6 us against 178.2 for 64 x 64; 50 x 512 204.6 against 214.1; 100 documents 136.5 against
      138.4; 1 x 512 9.92 against 10.19); bidirectional it was not (100 documents 172.3 against 64 x 32's 169.6,
      1 x 4096 275.6 against 64 x 64's 263.9); for the 4B's shape (four query heads a KV head,
      `results/triton_attention_tma_4b_5874c0c/`) four heads a program of 16 x 64 blocks at 1 x 2048 and 1 x 4096
      (284.1 us against 316.7 for 64 x 64), two elsewhere. End to end it was level (the 0.6B's long suites, two
      rounds, `results/triton_attention_pack_cdea3ae/`; the 4B's not run), so it is chosen only with `pack` True
      (PACK's setting, off by default).
    Head dims above 128 keep 64 x 64 and 2 stages for shared memory; smaller ones keep 64 x 64 by pointers (MiniLM's
    32: its 100 documents ran 10 % slower on 64 x 32 blocks end to end, one A/B); GPUs other than Hopper keep
    64 x 64 by pointers (unmeasured there)."""
    split = max_seqlen > 128
    if head_dim > 128:
        pointers = Blocks(64, 64, 4, 2, split, False)
    elif head_dim == 128 and max_seqlen >= 2048 and capability[0] == 9:
        pointers = Blocks(128, 128, 8, 3, True, False)
    else:
        pointers = Blocks(64, 32 if head_dim == 128 and seqs > 4 else 64, 4, 3, split, False)
    tma = TMA if tma is None else tma
    if tma is False:
        return pointers
    if head_dim == 128 and capability[0] == 9 and split:  # the shapes measured through descriptors
        if ((PACK if pack is None else pack) and causal and group % 2 == 0
                and (max_seqlen <= 4096 if seqs <= 4 else max_seqlen < 2048)):
            if group % 4 == 0 and seqs <= 4 and max_seqlen >= 2048:  # the 4B's long sequences: four heads
                return Blocks(16, 64, 4, 3, True, True, 4)
            return Blocks(32, 64, 4, 3, True, True, 2)
        if seqs <= 4 and max_seqlen < (4097 if causal else 4096):  # (longer: unmeasured, pointers)
            return Blocks(64, 64, 4, 3, True, True)
        if seqs > 4 and max_seqlen < 2048:
            return Blocks(64, 32, 4, 3, True, True)
    return pointers._replace(tma=True) if tma else pointers  # forced on: the pointer form's blocks


def longest_first(max_seqlen: int, seqs: int, causal: bool) -> bool:
    """Whether a layout's programs launch heads fastest and query blocks slowest (every head's longest causal blocks
    before any head's shorter ones) rather than one head's blocks after another's: for one to four causal sequences
    above a bound of 512, unless LONGEST_FIRST's setting forces it. Measured at head dim 128 on H100s
    (`triton_attention_sweep --tma --order`; `results/triton_attention_order_2219eb5/`, `…_few_edd631a/`),
    µs a call, block_config's blocks: the 0.6B's shape at 1 x 4096 causal 149.2 against 180.0, 1 x 2048 42.8 against
    59.2, 1 x 1024 19.3 against 21.1, 1 x 512 level (10.35 against 10.25); 2 x 4096 295-308 against 317-331, 4 x 2048
    172-176 against 179-185, 2 x 2048 86.7-86.9 against 100.9-101.5, 4 x 1024 55.3 against 60.9-61.7; the 4B's
    292.4 against 319.1 at 1 x 4096. Many sequences keep a head's blocks together: 50 x 512 causal 251.9 against
    215.0 (each sequence's K and V read again from memory for every query block, where one head's blocks in a row
    find them in L2), the 100 documents 146.5 against 139.3; bidirectional blocks carry equal work (1 x 1024-2048
    level)."""
    if LONGEST_FIRST is not None:
        return LONGEST_FIRST
    return causal and seqs <= 4 and max_seqlen > 512
