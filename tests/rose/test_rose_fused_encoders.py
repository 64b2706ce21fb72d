"""The encoders' norms in one kernel each (rose.layers.encoder_norms: add_layer_norm, the BERT, RoBERTa, XLM-R, MPNet
and DistilBERT output layers' add + LayerNorm; embed_layer_norm, their embeddings' sums + LayerNorm) on a CPU: under
Triton's interpreter against torch's definitions (float32 and float16; one row, MiniLM's width, a width past a power of
two; with and without a bias, strided rows; no type table, its row 0, a type per token). On the GPU, bf16:
test_rose_fused.py; the families' parity against transformers: the GPU parity tests."""

from __future__ import annotations

from tests.rose.interpreter import needs_triton, run_interpreted


@needs_triton
def test_kernels_match_torchs_definitions_under_the_interpreter():
    run_interpreted("add_layer_norm_interpreted.py", cases=24)


def test_the_switch_is_on_unless_turned_off():
    """ROSE_ENCODER_NORMS: on by default (measured, benchmarks/NOTES.md), off with 0 / false / off, and off with every
    fused kernel (ROSE_FUSED_KERNELS=0); read once, at import."""
    import os
    import subprocess
    import sys

    from tests.rose.interpreter import REPO

    def read(**env) -> str:
        base = {k: v for k, v in os.environ.items() if not k.startswith("ROSE_")}
        code = "from rose.layers import encoder_norms; print(encoder_norms.ENCODER_NORMS)"
        run = subprocess.run([sys.executable, "-c", code],
                             env={**base, "PYTHONPATH": str(REPO), **env}, capture_output=True, text=True, check=True)
        return run.stdout.strip()

    assert read() == "True" and read(ROSE_ENCODER_NORMS="1") == "True"
    assert read(ROSE_ENCODER_NORMS="0") == read(ROSE_ENCODER_NORMS="Off") == "False"
    assert read(ROSE_FUSED_KERNELS="0") == "False"
