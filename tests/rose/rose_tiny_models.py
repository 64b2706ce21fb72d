"""Tiny random models of every family ROSE serves, written as Hugging Face folders, and their references.

Used by the pytest fixtures (conftest.py) and by gpu_report.py. Each builder returns a `TinyModel`: the
folder, the `transformers` model holding the same weights (float32, eval) and how to compute the reference
embedding from its hidden states. Weights are random with a larger spread than HF's init (std 0.1, norm
weights around 1, non-zero biases) so that attention is far from uniform and a wrong mask, position or
norm shows up in the parity numbers.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

VOCAB = 256
WORDS = ["the", "a", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "hello", "world", "rose", "tulip",
         "ivy", "embed", "model", "token", "batch", "graph", "span"]


@dataclass
class TinyModel:
    name: str
    path: Path
    hf: torch.nn.Module  # transformers model with the same weights, float32, eval
    pad_id: int
    bidirectional_mask: bool  # the reference needs a 4D all-visible mask (pplx: non-causal Qwen3)
    pooling: str
    normalize: bool
    native_int8: bool
    dense: tuple = ()  # sentence-transformers Dense weights [out, in] (no bias, identity), applied after pooling

    def random_ids(self, rng: np.random.Generator, length: int) -> list[int]:
        """Ids that avoid the special/pad range (RoBERTa derives positions from the pad id)."""
        return [int(x) for x in rng.integers(5, VOCAB, size=length)]


def _randomize(model: torch.nn.Module, seed: int, std: float = 0.1) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name.lower() and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith("bias"):
                p.copy_(0.05 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(std * torch.randn(p.shape, generator=gen))


def _write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2), encoding="utf-8")


def _write_st_files(path: Path, dim: int, pooling: str, normalize: bool, max_len: int, prompts=None) -> None:
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    _write_json(path / "modules.json", modules)
    _write_json(path / "1_Pooling" / "config.json", {
        "word_embedding_dimension": dim, "pooling_mode_cls_token": pooling == "cls",
        "pooling_mode_mean_tokens": pooling == "mean", "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False, "pooling_mode_weightedmean_tokens": False,
        "pooling_mode_lasttoken": pooling == "last", "include_prompt": True})
    _write_json(path / "sentence_bert_config.json", {"max_seq_length": max_len, "do_lower_case": False})
    if prompts is not None:
        _write_json(path / "config_sentence_transformers.json",
                    {"prompts": prompts, "default_prompt_name": None, "similarity_fn_name": "cosine"})


def _bert_tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS)}
    for ch in "abcdefghijklmnopqrstuvwxyz":
        vocab.setdefault(ch, len(vocab))
        vocab.setdefault("##" + ch, len(vocab))
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.BertProcessing(("[SEP]", 3), ("[CLS]", 2))
    tok.decoder = decoders.WordPiece()
    tok.save(str(path / "tokenizer.json"))
    _write_json(path / "tokenizer_config.json", {"tokenizer_class": "BertTokenizer", "model_max_length": 64,
                                                  "pad_token": "[PAD]", "cls_token": "[CLS]", "sep_token": "[SEP]",
                                                  "unk_token": "[UNK]", "mask_token": "[MASK]", "do_lower_case": True})
    (path / "vocab.txt").write_text("\n".join(sorted(vocab, key=vocab.get)) + "\n", encoding="utf-8")


def _unigram_tokenizer(path: Path) -> None:
    """XLM-R style: <s>=0 <pad>=1 </s>=2 <unk>=3, Metaspace pieces, `<s> A </s>`."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    pieces = [("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    pieces += [("\u2581" + w, -2.0) for w in WORDS] + [(c, -5.0) for c in "abcdefghijklmnopqrstuvwxyz"]
    pieces += [("\u2581", -3.0), ("<mask>", 0.0)]
    tok = Tokenizer(models.Unigram(pieces, unk_id=3))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    tok.save(str(path / "tokenizer.json"))
    _write_json(path / "tokenizer_config.json", {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 64,
                                                  "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>",
                                                  "unk_token": "<unk>", "cls_token": "<s>", "sep_token": "</s>"})


def _sentencepiece_model(path: Path) -> None:
    """A real SentencePiece unigram model (no tokenizer.json): the XLM-R folders without one."""
    import io

    import sentencepiece as spm

    rng = np.random.default_rng(0)
    lines = [" ".join(rng.choice(WORDS, size=8)) for _ in range(200)]
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=buf, vocab_size=48,
                                   model_type="unigram", minloglevel=2)  # ids as XLM-R: <unk>=0 <s>=1 </s>=2
    (path / "sentencepiece.bpe.model").write_bytes(buf.getvalue())


def _word_tokenizer(path: Path, eos_suffix: bool) -> None:
    """Qwen3 style ids for tests: whole words; Qwen3-Embedding appends <|endoftext|> to every input."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {t: i for i, t in enumerate(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"] + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if eos_suffix:
        tok.post_processor = processors.TemplateProcessing(single="$A <|endoftext|>", special_tokens=[("<|endoftext|>", 0)])
    tok.save(str(path / "tokenizer.json"))
    _write_json(path / "tokenizer_config.json", {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 128,
                                                  "pad_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
                                                  "unk_token": "<unk>"})


def build_bert(root: Path, family: str = "bert", pooling: str = "mean", seed: int = 0,
               sentencepiece: bool = False, heads: int = 4) -> TinyModel:
    """bert | roberta | xlm-roberta; with sentencepiece=True an XLM-R folder holding only a .model; `heads` of
    hidden 64 (2: all-MiniLM's head dim of 32)."""
    from transformers import BertConfig, BertModel, RobertaConfig, RobertaModel, XLMRobertaConfig, XLMRobertaModel

    name = f"tiny-{family}" + ("-spm" if sentencepiece else "") + (f"-h{heads}" if heads != 4 else "")
    path = root / name
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    common = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=heads,
                  intermediate_size=128, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    if family == "bert":
        cfg, cls, pad = BertConfig(max_position_embeddings=64, pad_token_id=0, **common), BertModel, 0
    else:
        config_cls, cls = ((RobertaConfig, RobertaModel) if family == "roberta" else (XLMRobertaConfig, XLMRobertaModel))
        cfg, pad = config_cls(max_position_embeddings=66, pad_token_id=1, bos_token_id=0, eos_token_id=2, **common), 1
    torch.manual_seed(seed)
    hf = cls(cfg, add_pooling_layer=False)
    _randomize(hf, seed)
    hf.eval()
    hf.save_pretrained(path, safe_serialization=True)
    if family == "bert":
        _bert_tokenizer(path)
    elif sentencepiece:
        _sentencepiece_model(path)
    else:
        _unigram_tokenizer(path)
    _write_st_files(path, 64, pooling, True, 64)
    hf.config._attn_implementation = "eager"  # the reference: an implementation independent of ours
    return TinyModel(name, path, hf, pad, False, pooling, True, False)


def build_qwen3(root: Path, bidirectional: bool = False, sharded: bool = False, seed: int = 1,
                name: str | None = None, overrides: dict | None = None, std: float = 0.1) -> TinyModel:
    """Qwen3-Embedding style (causal, last token, normalized; with ST files) or pplx-embed style
    (bidirectional, mean, round(127*tanh), config model_type bidirectional_pplx_qwen3)."""
    from safetensors.torch import save_file
    from transformers import Qwen3Config, Qwen3Model

    name = name or ("tiny-pplx-qwen3" if bidirectional else "tiny-qwen3") + ("-sharded" if sharded else "")
    path = root / name
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    dims = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
                rope_theta=10000.0, rms_norm_eps=1e-6)
    dims.update(overrides or {})
    cfg = Qwen3Config(tie_word_embeddings=False, attention_dropout=0.0, **dims)
    torch.manual_seed(seed)
    hf = Qwen3Model(cfg)
    _randomize(hf, seed, std)
    hf.eval()
    if bidirectional:
        # pplx-embed's layout: its own model_type, checkpoint names under "model." (loader strips it).
        cfg_json = json.loads(cfg.to_json_string())
        cfg_json.update(model_type="bidirectional_pplx_qwen3", architectures=["PPLXQwen3Model"],
                        use_bidirectional_attention=True)
        _write_json(path / "config.json", cfg_json)
        save_file({"model." + k: v.contiguous() for k, v in hf.state_dict().items()}, str(path / "model.safetensors"))
        _word_tokenizer(path, eos_suffix=False)
    else:
        hf.save_pretrained(path, safe_serialization=True, max_shard_size="60KB" if sharded else "5GB")
        _word_tokenizer(path, eos_suffix=True)
        _write_st_files(path, cfg.hidden_size, "last", True, cfg.max_position_embeddings,
                        prompts={"query": "Instruct: find it\nQuery:", "document": ""})
    hf.config._attn_implementation = "eager"
    pooling = "mean" if bidirectional else "last"
    return TinyModel(name, path, hf, 0, bidirectional, pooling, not bidirectional, bidirectional)


def build_qwen3_06b_shape(root: Path, bidirectional: bool = False) -> TinyModel:
    """Qwen3-0.6B's widths (hidden 1024, 16 query / 8 KV heads of 128, MLP 3072, rope 1e6) in 2 layers:
    the kernels see the real head dim and GQA ratio at a fraction of the size."""
    tiny = build_qwen3(root, bidirectional=bidirectional, seed=7, std=0.02,
                       name="qwen3-0.6b-shape" + ("-pplx" if bidirectional else ""),
                       overrides=dict(hidden_size=1024, intermediate_size=3072, num_attention_heads=16,
                                      num_key_value_heads=8, head_dim=128, max_position_embeddings=4096,
                                      rope_theta=1000000.0))
    # The word tokenizer's config caps inputs at 128 tokens; these models take sequences over two query tiles.
    tok_config = tiny.path / "tokenizer_config.json"
    _write_json(tok_config, {**json.loads(tok_config.read_text()), "model_max_length": 4096})
    return tiny


def build_all(root: Path) -> dict[str, TinyModel]:
    """Every family, keyed by a short name."""
    return {
        "bert": build_bert(root, "bert", "mean"),
        "roberta": build_bert(root, "roberta", "mean", seed=2),
        "xlm-roberta": build_bert(root, "xlm-roberta", "cls", seed=3),
        "qwen3": build_qwen3(root, bidirectional=False, sharded=True),
        "pplx-qwen3": build_qwen3(root, bidirectional=True, seed=4),
    }
