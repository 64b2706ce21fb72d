"""HF baselines of the models with heads (benchmarks.model_zoo_heads), eager on padded batches as rose_gpu's others:

- a cross-encoder: AutoModelForSequenceClassification's one logit per pair, then the folder's activation
  (what sentence-transformers' CrossEncoder.predict computes);
- SPLADE: AutoModelForMaskedLM's logits, log(1 + relu), max over each sequence's real tokens (SparseEncoder's
  SpladePooling), one vocabulary-wide row per sequence;
- BGE-M3: its dense output, XLMRobertaModel's CLS hidden state normalized (rose_gpu.hf_runner, pooling "cls").
"""

from __future__ import annotations

import numpy as np
import torch


def pad(seqs: list[np.ndarray], device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask) int64 [B, longest], zero-padded on the right."""
    n = max(len(s) for s in seqs)
    ids = np.zeros((len(seqs), n), dtype=np.int64)
    mask = np.zeros((len(seqs), n), dtype=np.int64)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = s
        mask[i, : len(s)] = 1
    return torch.from_numpy(ids).to(device, non_blocking=True), torch.from_numpy(mask).to(device, non_blocking=True)


def hf_cross_runner(model_dir, activation: str, device: str, dtype=torch.bfloat16):
    """activation: rose.st_modules' name of the CrossEncoder activation (sigmoid | identity | ...)."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(model_dir, torch_dtype=dtype).to(device).eval()
    if activation not in ("sigmoid", "identity"):
        raise ValueError(f"the HF baseline applies sigmoid or identity, not {activation!r}")

    @torch.inference_mode()
    def run(seqs: list[np.ndarray]) -> np.ndarray:
        ids, mask = pad(seqs, device)
        logits = model(input_ids=ids, attention_mask=mask).logits[:, 0].float()
        return (torch.sigmoid(logits) if activation == "sigmoid" else logits).cpu().numpy()

    return run


def hf_splade_runner(model_dir, device: str, dtype=torch.bfloat16):
    from transformers import AutoModelForMaskedLM

    model = AutoModelForMaskedLM.from_pretrained(model_dir, torch_dtype=dtype).to(device).eval()

    @torch.inference_mode()
    def run(seqs: list[np.ndarray]) -> np.ndarray:
        ids, mask = pad(seqs, device)
        logits = model(input_ids=ids, attention_mask=mask).logits
        weights = torch.log1p(torch.relu(logits)) * mask[..., None].to(logits.dtype)  # padding: weight 0
        return weights.amax(dim=1).float().cpu().numpy()

    return run
