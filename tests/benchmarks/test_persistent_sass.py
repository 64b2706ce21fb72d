"""benchmarks.persistent_sass: the persistent decoder compiled for sm_90 on a machine without a GPU. The blocks'
own tiles of the Qwen3-0.6B (rose.layers.persistent_tiles.BLOCK_CHANGES) fit an SM's shared memory, and the
stages a block takes reach the compiled kernel (its K loops are software-pipelined: more cp.async copies in
flight, more shared memory)."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("triton")  # cuobjdump() below reads where Triton is
from benchmarks.persistent_sass import cuobjdump

pytestmark = pytest.mark.skipif(not os.path.exists(cuobjdump()), reason="Triton's wheel has no NVIDIA tools here")


def test_the_blocks_own_tiles_fit_and_their_stages_reach_the_kernel():
    from benchmarks.persistent_sass import SMEM_LIMIT, compile_block, meta_decoder

    decoder = meta_decoder("qwen3-0.6b")
    assert decoder.tiles_at(16).stages == decoder.tiles_at(128).stages == 4  # BLOCK_CHANGES' 16 and 128 tokens
    fitted = {t: compile_block(decoder, t) for t in (16, 128)}
    for row in fitted.values():
        assert row["fits"] and 0 < row["smem"] <= SMEM_LIMIT and row["cp.async"] > 0, row
    assert fitted[128]["wgmma"] > 0 and fitted[16]["wgmma"] == 0  # 16 rows: under wgmma's 64, mma.sync
    three = compile_block(meta_decoder("qwen3-0.6b", {"stages": 3}), 16)
    assert three["stages"] == 3 and three["smem"] < fitted[16]["smem"]
    assert three["cp.async"] < fitted[16]["cp.async"]


def test_the_barriers_counter_form_compiles_to_one_arrival_and_a_poll_of_one_word():
    """The barrier's counter form (Tiles.barrier): the inline PTX assembles for sm_90 (its labels local to its
    braces), and thread 0's arrival is one atomic add after a release fence, its poll an acquire load of the counter
    (rose.layers.grid_sync)."""
    import benchmarks.persistent_sass as sass_tool

    seen = {}
    disassembled = sass_tool._disassembled

    def keep(cubin):
        seen["sass"], resources = disassembled(cubin)
        return seen["sass"], resources

    sass_tool._disassembled = keep
    try:
        row = sass_tool.compile_block(sass_tool.meta_decoder("qwen3-0.6b", {"barrier": "counter"}), 16)
    finally:
        sass_tool._disassembled = disassembled
    lines = seen["sass"].splitlines()
    adds = [i for i, line in enumerate(lines) if "G.E.ADD.STRONG.GPU" in line]  # REDG or ATOMG
    assert row["fits"] and len(adds) == 1, adds
    after = "\n".join(lines[adds[0]:adds[0] + 40])
    assert "MEMBAR" in "\n".join(lines[adds[0] - 12:adds[0]]) and "LDG.E.STRONG.GPU" in after and "CCTL.IVALL" in after
