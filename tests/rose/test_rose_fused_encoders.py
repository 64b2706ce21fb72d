"""The encoders' add + LayerNorm in one kernel (rose.layers.fused.add_layer_norm: BERT, RoBERTa, XLM-R, MPNet and
DistilBERT output layers) on a CPU: under Triton's interpreter against torch's LayerNorm(x + residual) (float32 and
float16; one row, MiniLM's width, a width past a power of two; with and without a bias, strided rows). On the GPU,
bf16: test_rose_fused.py; the families' parity against transformers: the GPU parity tests."""

from __future__ import annotations

from tests.rose.interpreter import needs_triton, run_interpreted


@needs_triton
def test_kernel_matches_torchs_layer_norm_of_the_sum_under_the_interpreter():
    run_interpreted("add_layer_norm_interpreted.py", cases=12)
