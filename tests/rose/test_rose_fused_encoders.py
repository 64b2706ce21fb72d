"""The encoders' norms in one kernel each (rose.layers.encoder_norms: add_layer_norm, the BERT, RoBERTa, XLM-R, MPNet and
DistilBERT output layers' add + LayerNorm; embed_layer_norm, their embeddings' sums + LayerNorm) on a CPU: under
Triton's interpreter against torch's definitions (float32 and float16; one row, MiniLM's width, a width past a power of
two; with and without a bias, strided rows; no type table, its row 0, a type per token). On the GPU, bf16:
test_rose_fused.py; the families' parity against transformers: the GPU parity tests."""

from __future__ import annotations

from tests.rose.interpreter import needs_triton, run_interpreted


@needs_triton
def test_kernels_match_torchs_definitions_under_the_interpreter():
    run_interpreted("add_layer_norm_interpreted.py", cases=24)
