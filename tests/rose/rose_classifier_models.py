"""Tiny random sequence classifiers (num_labels 3) in the folder layouts users bring, and their reference.

- `bert-cls`: BertForSequenceClassification, single-label (softmax), id2label named like an emotion model's.
- `xlmr-cls`: XLMRobertaForSequenceClassification with problem_type multi_label_classification (sigmoid), as
  SamLowe/roberta-base-go_emotions ships (a RoBERTa classification head).
- `distilbert-cls`: DistilBertForSequenceClassification (distilbert sentiment models' shape).
The reference is transformers' own logits for a padded batch (attention mask), in fp32 on the CPU.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import torch
from rose_tiny_models import VOCAB, _bert_tokenizer, _randomize, _unigram_tokenizer

LABELS = {0: "joy", 1: "anger", 2: "fear"}
TEXTS = ["hello world", "the quick brown fox jumps over the lazy dog", "fox", "rose tulip ivy " * 30,
         "a lazy dog", "embed model token batch graph span"]
PAIRS = [("hello world", "the quick brown fox"), ("a lazy dog", "the dog jumps over the fox"),
         ("the quick brown fox jumps over the lazy dog " * 3, "hello " * 40), ("span", "graph batch")]
_SHAPE = {"vocab_size": VOCAB, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
          "intermediate_size": 128, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


def _fresh(root: Path, name: str) -> Path:
    path = root / name
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def _save(model, path: Path, seed: int) -> Path:
    _randomize(model, seed, std=0.2)  # wider than the encoders' so the logits spread (softmax far from uniform)
    model.save_pretrained(path, safe_serialization=True)
    return path


def build_bert_cls(root: Path, seed: int = 41) -> Path:
    from transformers import BertConfig, BertForSequenceClassification

    path = _fresh(root, "bert-cls")
    cfg = BertConfig(**_SHAPE, max_position_embeddings=64, pad_token_id=0, id2label=LABELS,
                     label2id={v: k for k, v in LABELS.items()})
    torch.manual_seed(seed)
    _save(BertForSequenceClassification(cfg), path, seed)
    _bert_tokenizer(path)
    return path


def build_xlmr_cls(root: Path, seed: int = 42) -> Path:
    from transformers import XLMRobertaConfig, XLMRobertaForSequenceClassification

    path = _fresh(root, "xlmr-cls")
    cfg = XLMRobertaConfig(**_SHAPE, max_position_embeddings=66, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                           id2label=LABELS, label2id={v: k for k, v in LABELS.items()},
                           problem_type="multi_label_classification")
    torch.manual_seed(seed)
    _save(XLMRobertaForSequenceClassification(cfg), path, seed)
    _unigram_tokenizer(path)
    return path


def build_distilbert_cls(root: Path, seed: int = 43) -> Path:
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    path = _fresh(root, "distilbert-cls")
    cfg = DistilBertConfig(vocab_size=VOCAB, dim=64, n_layers=2, n_heads=4, hidden_dim=128, max_position_embeddings=64,
                           dropout=0.0, attention_dropout=0.0, seq_classif_dropout=0.0, pad_token_id=0,
                           id2label=LABELS, label2id={v: k for k, v in LABELS.items()})
    torch.manual_seed(seed)
    _save(DistilBertForSequenceClassification(cfg), path, seed)
    _bert_tokenizer(path)
    return path


def build_all_classifiers(root: Path) -> dict[str, Path]:
    return {"bert-cls": build_bert_cls(root), "xlmr-cls": build_xlmr_cls(root),
            "distilbert-cls": build_distilbert_cls(root)}


@torch.no_grad()
def hf_logits(path: Path, inputs: list, device: str = "cpu",
              dtype: torch.dtype = torch.float32) -> tuple[np.ndarray, list[list[int]]]:
    """transformers' logits for texts or (text, text_pair) tuples in one padded batch, cut to the model's length
    (longest first for pairs), and each input's ids (unpadded) to check the engine's tokenization against;
    `dtype`: the model's (bfloat16: the reference's own rounding error, what a bf16 engine is held to)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    pairs = isinstance(inputs[0], tuple)
    args = ([a for a, _ in inputs], [b for _, b in inputs]) if pairs else (list(inputs),)
    enc = tok(*args, padding=True, truncation=True, return_tensors="pt").to(device)
    model = AutoModelForSequenceClassification.from_pretrained(str(path), dtype=dtype).to(device).eval()
    logits = model(**enc).logits.float().cpu().numpy()
    ids = [row[mask.bool()].tolist() for row, mask in zip(enc["input_ids"].cpu(), enc["attention_mask"].cpu())]
    return logits, ids
