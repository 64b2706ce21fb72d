"""Cross-encoder folders for Ivy's tests, torch-free (no weights: the fake Tulip scores): config.json, the
tokenizer and the sentence-transformers files in the layouts the real rerankers ship."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ivy_testkit import model_copy

SEQ_CLS = {"architectures": ["BertForSequenceClassification"], "id2label": {"0": "LABEL_0"},
           "label2id": {"LABEL_0": 0}}


def bert_reranker(tmp_path: Path, name: str = "minilm-reranker", **config) -> Path:
    """ms-marco-MiniLM's layout: the bundled MiniLM's BERT tokenizer (pairs with token types), a
    one-label BertForSequenceClassification config, no pooling modules."""
    path = model_copy(tmp_path, name, config={**SEQ_CLS, **config})
    for extra in ("modules.json", "1_Pooling", "config_sentence_transformers.json"):
        target = path / extra
        shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)
    return path


def qwen3_reranker(tmp_path: Path, name: str = "tiny-qwen3-reranker") -> Path:
    """Qwen3-Reranker's layout: a Qwen3ForCausalLM config and a word-level tokenizer that knows the template's
    special tokens (matched inside text, as Qwen's added tokens are), "yes" and "no"."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    path = tmp_path / name
    path.mkdir(parents=True)
    config = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 512, "hidden_size": 64,
              "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 16, "max_position_embeddings": 256, "tie_word_embeddings": True}
    (path / "config.json").write_text(json.dumps(config))
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
    words = ("Judge whether the Document meets requirements based on Query and Instruct provided . Note that answer "
             "can only be \" yes or no \" system user assistant < > : Given a web search query , retrieve relevant "
             "passages answer where do cats sleep sofa stock prices fell today dogs birds fly find").split()
    vocab: dict[str, int] = {}
    for token in [*specials, "<unk>", *words]:
        vocab.setdefault(token, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(specials)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 256, "pad_token": "<|endoftext|>",
        "eos_token": "<|im_end|>", "unk_token": "<unk>"}))
    return path


EMOTIONS = {"0": "joy", "1": "anger", "2": "fear"}


def bert_classifier(tmp_path: Path, name: str = "minilm-emotions", **config) -> Path:
    """A sequence classifier's layout (distilbert / go_emotions style): the bundled MiniLM's BERT tokenizer and
    a BertForSequenceClassification config with three labels; `problem_type` and the rest as given."""
    return bert_reranker(tmp_path, name, **{"id2label": EMOTIONS, "label2id": {v: int(k) for k, v in EMOTIONS.items()},
                                            **config})
