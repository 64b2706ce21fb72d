"""The pooling kernel (rose.layers.pooling, ROSE_FUSED_POOLING) on a CPU: under Triton's interpreter against torch's
segment mean, for a long sequence's mean (blocks in one span), short sequences' (blocks across spans), CLS rows among
dummies, late chunks across a block's edge, filler rows and a width past a power of two. On the GPU, bf16:
test_rose_fused.py; the families' parity with it on: `device.sh encoder-norms` (its tests), `device.sh encoder-pooling` (the A/B)."""

from __future__ import annotations

from tests.rose.interpreter import needs_triton, run_interpreted


@needs_triton
def test_pooling_kernel_matches_torchs_segment_mean_under_the_interpreter():
    run_interpreted("pooling_interpreted.py", cases=12)
