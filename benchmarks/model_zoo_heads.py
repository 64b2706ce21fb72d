"""Benchmark folders of the models with heads past the encoder (issue 16): cross-encoder rerankers, SPLADE, BGE-M3.

Published shapes, random weights (std 0.02, seeded), MiniLM's tokenizer (benchmarks feed token ids; its ids fit
every vocabulary here), written with transformers' save_pretrained plus the files each model ships:
- `ms-marco-minilm-l6`: BertForSequenceClassification (cross-encoder/ms-marco-MiniLM-L-6-v2: 6 layers of 384,
  12 heads, one label), config.json's `sentence_transformers.activation_fn` Identity as its hub folder says.
- `bge-reranker-v2-m3`: XLMRobertaForSequenceClassification at XLM-R large (24 layers of 1024, vocabulary
  250002, 8194 positions), one label, no sentence-transformers files (CrossEncoder's default Sigmoid).
- `qwen3-reranker-0.6b`: Qwen3ForCausalLM at Qwen3-0.6B (Qwen/Qwen3-Reranker-0.6B: 28 layers of 1024, tied
  embeddings) with vLLM's `is_original_qwen3_reranker` in config.json: the score is P("yes") from the last
  token's "yes" and "no" logits (MiniLM's tokenizer resolves both words).
- `splade-cocondenser`: BertForMaskedLM at bert-base (naver/splade-cocondenser-ensembledistil) in
  sentence-transformers' SparseEncoder layout: Transformer (fill-mask) then SpladePooling max / relu.
- `bge-m3`: XLMRobertaModel at XLM-R large with CLS pooling + Normalize and FlagEmbedding's colbert_linear.pt
  (1024 -> 1024) and sparse_linear.pt (1024 -> 1).
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.model_zoo import QWEN3_CONFIGS

XLMR_LARGE = dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096,
                  vocab_size=250002, max_position_embeddings=8194, type_vocab_size=1, layer_norm_eps=1e-5,
                  pad_token_id=1, bos_token_id=0, eos_token_id=2)
HEAD_CONFIGS = {  # name -> (transformers config and model class, the published values, max_seq_length)
    "ms-marco-minilm-l6": ("BertConfig", "BertForSequenceClassification", dict(
        hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536, vocab_size=30522,
        max_position_embeddings=512, num_labels=1), 512),
    "bge-reranker-v2-m3": ("XLMRobertaConfig", "XLMRobertaForSequenceClassification", dict(XLMR_LARGE, num_labels=1),
                           8192),
    "qwen3-reranker-0.6b": ("Qwen3Config", "Qwen3ForCausalLM", dict(QWEN3_CONFIGS["qwen3-0.6b"],
                                                                    is_original_qwen3_reranker=True), 32768),
    "splade-cocondenser": ("BertConfig", "BertForMaskedLM", dict(vocab_size=30522), 512),
    "bge-m3": ("XLMRobertaConfig", "XLMRobertaModel", dict(XLMR_LARGE), 8192),
}
ST_TRANSFORMER = "sentence_transformers.models.Transformer"


def _write(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2))


def _tokenizer(out: Path, max_seq: int) -> None:
    from benchmarks.model_zoo import _copy_tokenizer

    _copy_tokenizer(out / "tokenizer.json")
    _write(out / "tokenizer_config.json", {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_seq,
                                           "cls_token": "[CLS]", "sep_token": "[SEP]", "unk_token": "[UNK]",
                                           "pad_token": "[PAD]", "mask_token": "[MASK]"})


def _st_files(out: Path, name: str, hidden: int, max_seq: int) -> None:
    """The sentence-transformers files the published folder has (none for the rerankers' pipelines but MiniLM's
    activation, which lives in config.json)."""
    if name == "ms-marco-minilm-l6":
        config = json.loads((out / "config.json").read_text())
        config["sentence_transformers"] = {"activation_fn": "torch.nn.modules.linear.Identity", "version": "4.0.1"}
        _write(out / "config.json", config)
    elif name == "splade-cocondenser":
        _write(out / "modules.json", [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.base.modules.Transformer"},
            {"idx": 1, "name": "1", "path": "1_SpladePooling",
             "type": "sentence_transformers.sparse_encoder.modules.SpladePooling"}])
        _write(out / "sentence_bert_config.json", {"max_seq_length": max_seq, "do_lower_case": False,
                                                   "transformer_task": "fill-mask"})
        _write(out / "config_sentence_transformers.json", {"model_type": "SparseEncoder", "prompts": {}})
        _write(out / "1_SpladePooling" / "config.json", {"pooling_strategy": "max", "activation_function": "relu",
                                                         "embedding_dimension": None})
    elif name == "bge-m3":
        _write(out / "modules.json", [
            {"idx": 0, "name": "0", "path": "", "type": ST_TRANSFORMER},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}])
        _write(out / "1_Pooling" / "config.json", {"word_embedding_dimension": hidden, "pooling_mode_cls_token": True,
                                                   "pooling_mode_mean_tokens": False})
        _write(out / "sentence_bert_config.json", {"max_seq_length": max_seq, "do_lower_case": False})


def make_head_folder(name: str, out: Path, dtype: str = "bfloat16", seed: int = 0) -> Path:
    import torch

    from benchmarks.model_zoo import save_random_model

    config_cls, model_cls, values, max_seq = HEAD_CONFIGS[name]
    extra = {"add_pooling_layer": False} if model_cls == "XLMRobertaModel" else {}
    # drawn on the GPU where there is one: XLM-R large is ~0.6 B values
    config = save_random_model(out, config_cls, model_cls, values, dtype, seed, on_gpu=True, **extra)
    hidden = config.hidden_size
    _st_files(out, name, hidden, max_seq)
    if name == "bge-m3":
        gen = torch.Generator().manual_seed(seed)
        for file, width in (("colbert_linear.pt", hidden), ("sparse_linear.pt", 1)):
            torch.save({"weight": (0.02 * torch.randn(width, hidden, generator=gen)).to(getattr(torch, dtype)),
                        "bias": torch.zeros(width, dtype=getattr(torch, dtype))}, out / file)
    _tokenizer(out, max_seq)
    return out
