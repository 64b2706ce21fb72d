"""Tiny random cross-encoders (rerankers) in the folder layouts users bring, and their references.

- `bert-ce`: BertForSequenceClassification (ms-marco-MiniLM's shape), saved by sentence-transformers 6's
  CrossEncoder (modules.json, config_sentence_transformers.json with activation_fn Sigmoid).
- `bert-ce-identity`: the hub layout of cross-encoder/ms-marco-MiniLM-L6-v2: no ST files, config.json's
  `sentence_transformers.activation_fn` Identity (raw logits).
- `xlmr-ce`: XLMRobertaForSequenceClassification (bge-reranker-v2-m3's shape), HF folder only (Sigmoid).
- `qwen3-reranker` / `qwen3-reranker-tied`: Qwen3ForCausalLM as Qwen3-Reranker ships it (untied lm_head like
  the 4B, tied like the 0.6B), a tokenizer with "yes", "no" and the template's special tokens.
References: sentence-transformers' CrossEncoder.predict for the classifiers; for the yes/no rerankers the
model card's recipe on the transformers model: softmax over the "yes" and "no" logits of the last token.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import torch
from rose_tiny_models import VOCAB, WORDS, _bert_tokenizer, _randomize, _unigram_tokenizer, _write_json

# The Qwen3-Reranker model card's prompt, typed out here as the reference (Ivy keeps its own copy).
QWEN3_PREFIX = ("<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
                "Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n")
QWEN3_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
QWEN3_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
PAIRS = [("hello world", "the quick brown fox"), ("a lazy dog", "the dog jumps over the fox"),
         ("rose tulip ivy", "embed model token batch graph span"), ("fox", "fox"),
         ("the quick brown fox jumps over the lazy dog " * 3, "hello " * 40), ("span", "graph batch")]


def _fresh(root: Path, name: str) -> Path:
    path = root / name
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def build_bert_ce(root: Path, seed: int = 31) -> Path:
    """BertForSequenceClassification(num_labels=1), saved through sentence-transformers' CrossEncoder."""
    from sentence_transformers import CrossEncoder
    from transformers import BertConfig, BertForSequenceClassification

    base = _fresh(root, "bert-ce-base")
    cfg = BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, max_position_embeddings=64, num_labels=1, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0, pad_token_id=0)
    torch.manual_seed(seed)
    model = BertForSequenceClassification(cfg)
    _randomize(model, seed)
    model.save_pretrained(base, safe_serialization=True)
    _bert_tokenizer(base)
    out = root / "bert-ce"
    shutil.rmtree(out, ignore_errors=True)
    CrossEncoder(str(base), device="cpu").save(str(out))
    shutil.rmtree(base)
    return out


def build_bert_ce_identity(root: Path, seed: int = 32) -> Path:
    """ms-marco-MiniLM's hub layout: an HF folder whose config.json asks for raw logits (Identity)."""
    from transformers import BertConfig, BertForSequenceClassification

    path = _fresh(root, "bert-ce-identity")
    cfg = BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, max_position_embeddings=64, num_labels=1, pad_token_id=0)
    torch.manual_seed(seed)
    model = BertForSequenceClassification(cfg)
    _randomize(model, seed)
    model.save_pretrained(path, safe_serialization=True)
    config = json.loads((path / "config.json").read_text())
    config["sentence_transformers"] = {"activation_fn": "torch.nn.modules.linear.Identity", "version": "4.0.1"}
    _write_json(path / "config.json", config)
    _bert_tokenizer(path)
    return path


def build_xlmr_ce(root: Path, seed: int = 33) -> Path:
    """XLMRobertaForSequenceClassification(num_labels=1) as bge-reranker-v2-m3 ships: HF files only."""
    from transformers import XLMRobertaConfig, XLMRobertaForSequenceClassification

    path = _fresh(root, "xlmr-ce")
    cfg = XLMRobertaConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=128, max_position_embeddings=66, pad_token_id=1, bos_token_id=0,
                           eos_token_id=2, num_labels=1, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(seed)
    model = XLMRobertaForSequenceClassification(cfg)
    _randomize(model, seed)
    model.save_pretrained(path, safe_serialization=True)
    _unigram_tokenizer(path)
    return path


def _qwen3_tokenizer(path: Path) -> None:
    """Whole words, the template's words included, and its special tokens matched inside text."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
    pre = pre_tokenizers.Whitespace()
    template = " ".join([QWEN3_PREFIX, QWEN3_SUFFIX, QWEN3_INSTRUCTION, "<Instruct>: <Query>: <Document>:"])
    pieces = [p for p, _ in pre.pre_tokenize_str(template)]
    vocab: dict[str, int] = {}
    for token in [*specials, "<unk>", "yes", "no", *WORDS, *pieces]:
        vocab.setdefault(token, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre
    tok.add_special_tokens(specials)
    tok.save(str(path / "tokenizer.json"))
    _write_json(path / "tokenizer_config.json", {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 256,
                                                  "pad_token": "<|endoftext|>", "eos_token": "<|im_end|>",
                                                  "unk_token": "<unk>"})


def build_qwen3_reranker(root: Path, tied: bool = False, seed: int = 34) -> Path:
    """Qwen3ForCausalLM in a folder named like Qwen3-Reranker's (that name is what marks it a reranker)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    path = _fresh(root, "tiny-qwen3-reranker" + ("-tied" if tied else ""))
    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                      rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=tied, attention_dropout=0.0)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(cfg)
    _randomize(model, seed)
    if tied:
        model.tie_weights()
    model.save_pretrained(path, safe_serialization=True)
    _qwen3_tokenizer(path)
    return path


def qwen3_recipe_ids(path: Path, query: str, document: str, instruction: str = QWEN3_INSTRUCTION,
                     max_length: int = 256) -> list[int]:
    """The model card's process_inputs for one pair: prefix + the formatted pair (truncated) + suffix."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    prefix = tok.encode(QWEN3_PREFIX, add_special_tokens=False)
    suffix = tok.encode(QWEN3_SUFFIX, add_special_tokens=False)
    text = f"<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}"
    body = tok([text], padding=False, truncation="longest_first", return_attention_mask=False,
               max_length=max_length - len(prefix) - len(suffix))["input_ids"][0]
    return prefix + body + suffix


@torch.no_grad()
def qwen3_yes_probability(path: Path, sequences: list[list[int]], dtype=torch.float32, device="cpu",
                          raw: bool = False) -> np.ndarray:
    """softmax over the "yes" and "no" logits of each sequence's last token, one sequence at a time; `raw`:
    logit(yes) - logit(no), the logit the softmax's yes is the sigmoid of."""
    from transformers import AutoTokenizer, Qwen3ForCausalLM

    tok = AutoTokenizer.from_pretrained(str(path))
    yes, no = tok.convert_tokens_to_ids("yes"), tok.convert_tokens_to_ids("no")
    model = Qwen3ForCausalLM.from_pretrained(str(path), dtype=dtype).to(device).eval()
    out = []
    for seq in sequences:
        logits = model(input_ids=torch.tensor([seq], device=device)).logits[0, -1].float()
        pair = torch.stack([logits[no], logits[yes]])
        out.append((pair[1] - pair[0]).item() if raw else torch.softmax(pair, dim=0)[1].item())
    return np.array(out)


def cross_encoder_scores(path: Path, pairs, device: str = "cpu", raw: bool = False) -> np.ndarray:
    """sentence-transformers' CrossEncoder.predict on the folder (its own tokenization and activation; `raw`:
    with Identity for its activation, the logits)."""
    from sentence_transformers import CrossEncoder

    identity = {"activation_fn": torch.nn.Identity()} if raw else {}
    return np.asarray(CrossEncoder(str(path), device=device).predict(list(pairs), batch_size=64, **identity),
                      dtype=np.float64)


def build_all_cross(root: Path) -> dict[str, Path]:
    return {"bert-ce": build_bert_ce(root), "bert-ce-identity": build_bert_ce_identity(root),
            "xlmr-ce": build_xlmr_ce(root), "qwen3-reranker": build_qwen3_reranker(root),
            "qwen3-reranker-tied": build_qwen3_reranker(root, tied=True, seed=35)}


def random_pair_ids(rng: np.random.Generator, lengths) -> list[list[int]]:
    return [[int(x) for x in rng.integers(5, VOCAB, size=n)] for n in lengths]
