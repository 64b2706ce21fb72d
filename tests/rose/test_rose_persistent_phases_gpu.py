"""Each phase of the persistent kernel on the GPU against the layer path's own kernels, one step at a time, bf16,
two layers and the final norm: Qwen3 at the 0.6B's layer shape (causal and not) and a BERT encoder at
all-MiniLM's (the checks: persistent_phases.py). The whole-model bar (test_rose_persistent_decoder_gpu.py:
relative error 2e-2) cannot see one rounding step missed or added; these can."""

from __future__ import annotations

import pytest
import torch

from rose.layers import persistent_decoder
from rose.layers.persistent_decoder import PersistentDecoder
from tests.rose.persistent_phases import check_phases

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available() or persistent_decoder.triton is None,
                                                  reason="needs CUDA and Triton")]


@pytest.mark.parametrize("model", ["qwen3-causal", "qwen3-bidirectional", "minilm"])
def test_every_phase_matches_the_layer_kernels(model):
    from benchmarks.persistent_decoder import device_meta, embed, random_bert, random_qwen3

    causal = model == "qwen3-causal"
    net = random_bert(layers=2, seed=7) if model == "minilm" else random_qwen3(causal=causal, layers=2, seed=7)
    meta = device_meta([5, 60, 3, 17], 1000, seed=1)  # ragged, 85 tokens
    dec = PersistentDecoder(net)
    with torch.inference_mode():
        assert check_phases(dec, embed(net, meta), meta.positions, meta.seq_ids, causal) == 2 * 8 + 1  # heads step
