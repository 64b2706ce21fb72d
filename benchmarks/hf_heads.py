"""HF baselines of the models with heads (benchmarks.model_zoo_heads), eager on padded batches as rose_gpu's others:

- a cross-encoder: AutoModelForSequenceClassification's one logit per pair, or a Qwen3-Reranker's
  logit(yes) - logit(no) at the last token, then the folder's activation (what sentence-transformers'
  CrossEncoder.predict computes);
- SPLADE: AutoModelForMaskedLM's logits, log(1 + relu), max over each sequence's real tokens (SparseEncoder's
  SpladePooling), one vocabulary-wide row per sequence;
- BGE-M3: its dense output, XLMRobertaModel's CLS hidden state normalized (rose_gpu.hf_runner, pooling "cls").
"""

from __future__ import annotations

from pathlib import Path

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


def hf_cross_runner(model_dir, head, device: str, dtype=torch.bfloat16):
    """head: the folder's rose.cross_spec.ScoreHead (its kind and the CrossEncoder activation it applies)."""
    if head.activation not in ("sigmoid", "identity"):
        raise ValueError(f"the HF baseline applies sigmoid or identity, not {head.activation!r}")
    score = _yes_no_logit(model_dir, head, device, dtype) if head.kind == "yes_no" else _class_logit(model_dir, device,
                                                                                                     dtype)

    @torch.inference_mode()
    def run(seqs: list[np.ndarray]) -> np.ndarray:
        ids, mask = pad(seqs, device)
        logits = score(ids, mask).float()
        return (torch.sigmoid(logits) if head.activation == "sigmoid" else logits).cpu().numpy()

    return run


def _class_logit(model_dir, device: str, dtype):
    """AutoModelForSequenceClassification's one logit per pair."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(model_dir, torch_dtype=dtype).to(device).eval()
    return lambda ids, mask: model(input_ids=ids, attention_mask=mask).logits[:, 0]


def _yes_no_logit(model_dir, head, device: str, dtype):
    """A Qwen3-Reranker's logit(yes) - logit(no) at each pair's last token: the causal LM's hidden states,
    gathered at the last real token, through its lm_head (the whole vocabulary for those rows only: all
    positions' logits would be [B, L, 151 669])."""
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=dtype).to(device).eval()
    tokenizer = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    yes, no = (t if isinstance(t, int) else tokenizer.token_to_id(t) for t in (head.true_token, head.false_token))

    def score(ids, mask):
        hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
        last = hidden[torch.arange(len(ids), device=ids.device), mask.sum(1) - 1]
        logits = model.lm_head(last)
        return logits[:, yes] - logits[:, no]

    return score


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
