"""Tiny random sparse and multi-vector models in the folder layouts users bring, and their references.

- `splade`: BertForMaskedLM saved by sentence-transformers' SparseEncoder (Transformer with transformer_task
  fill-mask, then SpladePooling max / relu), as naver/splade-v3 and opensearch's SPLADE models ship; the
  reference is SparseEncoder.encode.
- `bge-m3`: an XLM-R folder as BAAI/bge-m3 ships it (ST files: CLS pooling + Normalize) with FlagEmbedding's
  colbert_linear.pt and sparse_linear.pt; the reference is BGE-M3's math typed out here on the transformers
  model: dense = normalize(h[CLS]); ColBERT = normalize(colbert_linear(h[1:])); sparse = relu(sparse_linear(h))
  per token, max over repeated ids, the cls / eos / pad / unk ids left out, weights > 0 only.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import torch
from rose_tiny_models import VOCAB, _bert_tokenizer, _randomize, _unigram_tokenizer, _write_json, _write_st_files

M3_EXCLUDED = (0, 1, 2, 3)  # the tiny XLM-R tokenizer's <s>, <pad>, </s>, <unk>
TEXTS = ["hello world", "the quick brown fox jumps over the lazy dog", "fox fox fox dog", "rose tulip ivy embed",
         "a", "graph batch span token model " * 4]


def _fresh(root: Path, name: str) -> Path:
    path = root / name
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def build_splade(root: Path, seed: int = 41, activation: str = "relu", strategy: str = "max") -> Path:
    from sentence_transformers import SparseEncoder
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sparse_encoder.modules import SpladePooling
    from transformers import BertConfig, BertForMaskedLM

    base = _fresh(root, "splade-base")
    cfg = BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, max_position_embeddings=64, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0, pad_token_id=0)
    torch.manual_seed(seed)
    model = BertForMaskedLM(cfg)
    _randomize(model, seed, std=0.15)
    model.save_pretrained(base, safe_serialization=True)
    _bert_tokenizer(base)
    name = "splade" if (activation, strategy) == ("relu", "max") else f"splade-{activation}-{strategy}"
    out = root / name
    shutil.rmtree(out, ignore_errors=True)
    encoder = SparseEncoder(modules=[Transformer(str(base), transformer_task="fill-mask"),
                                     SpladePooling(strategy, activation_function=activation)], device="cpu")
    encoder.save(str(out))
    shutil.rmtree(base)
    return out


def splade_reference(path: Path, texts: list[str]) -> np.ndarray:
    """SparseEncoder.encode as dense float32 rows [n, vocab]."""
    from sentence_transformers import SparseEncoder

    encoder = SparseEncoder(str(path), device="cpu")
    return encoder.encode(texts, convert_to_tensor=True).to_dense().float().numpy()


class M3Reference:
    """BGE-M3's three outputs on the transformers model, as FlagEmbedding computes them (typed out here)."""

    def __init__(self, path: Path) -> None:
        from transformers import XLMRobertaModel

        self.model = XLMRobertaModel.from_pretrained(str(path), attn_implementation="eager").eval()
        self.colbert = torch.load(path / "colbert_linear.pt", weights_only=True)
        self.sparse = torch.load(path / "sparse_linear.pt", weights_only=True)

    def hidden(self, ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return self.model(input_ids=torch.tensor([ids])).last_hidden_state[0].float()

    def dense(self, ids: list[int]) -> np.ndarray:
        return torch.nn.functional.normalize(self.hidden(ids)[0], dim=-1).numpy()

    def colbert_vectors(self, ids: list[int]) -> np.ndarray:
        h = self.hidden(ids)[1:]
        vecs = h @ self.colbert["weight"].t() + self.colbert["bias"]
        return torch.nn.functional.normalize(vecs, dim=-1).numpy()

    def lexical_weights(self, ids: list[int]) -> dict[int, float]:
        weights = torch.relu(self.hidden(ids) @ self.sparse["weight"].t() + self.sparse["bias"])[:, 0].numpy()
        out: dict[int, float] = {}
        for token, w in zip(ids, weights):
            if token not in M3_EXCLUDED and w > 0 and w > out.get(token, 0.0):
                out[token] = float(w)
        return out


def build_bge_m3(root: Path, seed: int = 42) -> Path:
    from transformers import XLMRobertaConfig, XLMRobertaModel

    path = _fresh(root, "bge-m3")
    cfg = XLMRobertaConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=128, max_position_embeddings=66, pad_token_id=1, bos_token_id=0,
                           eos_token_id=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(seed)
    model = XLMRobertaModel(cfg, add_pooling_layer=False)
    _randomize(model, seed)
    model.save_pretrained(path, safe_serialization=True)
    _unigram_tokenizer(path)
    _write_st_files(path, 64, "cls", True, 64)
    gen = torch.Generator().manual_seed(seed)
    torch.save({"weight": 0.2 * torch.randn(64, 64, generator=gen), "bias": 0.05 * torch.randn(64, generator=gen)},
               path / "colbert_linear.pt")
    torch.save({"weight": 0.2 * torch.randn(1, 64, generator=gen), "bias": torch.tensor([0.05])},
               path / "sparse_linear.pt")
    _write_json(path / "special_tokens_map.json", {"bos_token": "<s>", "cls_token": "<s>", "eos_token": "</s>",
                                                   "pad_token": "<pad>", "unk_token": "<unk>", "sep_token": "</s>"})
    return path


def maxsim(query: np.ndarray, document: np.ndarray) -> float:
    """BGE-M3's colbert_score: each query vector's best dot product with the document's, averaged."""
    return float((query @ document.T).max(axis=1).sum() / query.shape[0])


def build_splade_files(root: Path, seed: int = 41) -> Path:
    """The files SparseEncoder.save writes for `splade`, written here without sentence-transformers (its
    version on the device may differ): BertForMaskedLM, tokenizer, modules.json, SpladePooling max / relu."""
    from transformers import BertConfig, BertForMaskedLM

    path = _fresh(root, "splade-files")
    cfg = BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, max_position_embeddings=64, pad_token_id=0)
    torch.manual_seed(seed)
    model = BertForMaskedLM(cfg)
    _randomize(model, seed, std=0.15)
    model.save_pretrained(path, safe_serialization=True)
    _bert_tokenizer(path)
    _write_json(path / "modules.json", [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.base.modules.transformer.Transformer"},
        {"idx": 1, "name": "1", "path": "1_SpladePooling",
         "type": "sentence_transformers.sparse_encoder.modules.splade_pooling.SpladePooling"}])
    _write_json(path / "sentence_bert_config.json", {"transformer_task": "fill-mask",
                                                     "module_output_name": "token_embeddings"})
    _write_json(path / "config_sentence_transformers.json", {"model_type": "SparseEncoder", "prompts": {}})
    _write_json(path / "1_SpladePooling" / "config.json", {"pooling_strategy": "max", "activation_function": "relu",
                                                           "embedding_dimension": None})
    return path
