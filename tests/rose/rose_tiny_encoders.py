"""Tiny random ModernBERT, MPNet and DistilBERT folders in their real config layout, and their references.

Same contract as rose_tiny_models (a TinyModel: the folder, the transformers model with the same weights,
pooling and normalization); each folder has the tokenizer.json layout of its family's published models:
ModernBERT a byte-level BPE with `[CLS] A [SEP]`, MPNet a WordPiece with RoBERTa's `<s> A </s>` and
<s>=0 <pad>=1 </s>=2 <unk>=3, DistilBERT BERT's WordPiece. ModernBERT's window (local_attention 16: 8 each
way) is far shorter than the test sequences, and its RoPE thetas are not the defaults, so a layer of the
wrong kind or a theta read from the wrong field shows up in the parity numbers.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from rose_tiny_models import VOCAB, WORDS, TinyModel, _bert_tokenizer, _randomize, _write_json, _write_st_files

MODERNBERT_VOCAB = 320
MODERNBERT_SPECIALS = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]  # ids 0..4


def _fresh(root: Path, name: str) -> Path:
    path = root / name
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def _finish(hf: torch.nn.Module, seed: int, path: Path, std: float = 0.1,
            scale: dict[str, float] | None = None) -> None:
    _randomize(hf, seed, std)
    with torch.no_grad():
        for name, factor in (scale or {}).items():
            hf.get_parameter(name).mul_(factor)
    hf.eval()
    hf.save_pretrained(path, safe_serialization=True)
    hf.config._attn_implementation = "eager"  # the reference: an implementation independent of ours


def _byte_bpe_tokenizer(path: Path, max_len: int) -> None:
    """ModernBERT style: ByteLevel pre-tokenizer and decoder, BPE, `[CLS] $A [SEP]`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=MODERNBERT_SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([" ".join(WORDS)] * 20, trainer)
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
                                                       special_tokens=[("[CLS]", 1), ("[SEP]", 2)])
    tok.save(str(path / "tokenizer.json"))
    _write_json(path / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_len, "cls_token": "[CLS]",
        "sep_token": "[SEP]", "pad_token": "[PAD]", "unk_token": "[UNK]", "mask_token": "[MASK]"})


def _mpnet_tokenizer(path: Path, max_len: int) -> None:
    """all-mpnet-base-v2 style: BertNormalizer + BertPreTokenizer + WordPiece, RobertaProcessing `<s> A </s>`."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    vocab = {t: i for i, t in enumerate(["<s>", "<pad>", "</s>", "<unk>", "[UNK]"] + WORDS)}
    for ch in "abcdefghijklmnopqrstuvwxyz":
        vocab.setdefault(ch, len(vocab))
        vocab.setdefault("##" + ch, len(vocab))
    vocab["<mask>"] = len(vocab)
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    tok.decoder = decoders.WordPiece()
    tok.save(str(path / "tokenizer.json"))
    _write_json(path / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_len, "bos_token": "<s>",
        "eos_token": "</s>", "cls_token": "<s>", "sep_token": "</s>", "pad_token": "<pad>", "unk_token": "[UNK]",
        "mask_token": "<mask>", "do_lower_case": True})


def build_modernbert(root: Path, seed: int = 21, name: str = "tiny-modernbert", std: float = 0.1,
                     max_len: int = 128, **overrides) -> TinyModel:
    from transformers import ModernBertConfig, ModernBertModel

    path = _fresh(root, name)
    dims = dict(vocab_size=MODERNBERT_VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                num_attention_heads=4, max_position_embeddings=max_len, global_attn_every_n_layers=3,
                local_attention=16, global_rope_theta=5000.0, local_rope_theta=500.0)
    dims.update(overrides)
    cfg = ModernBertConfig(pad_token_id=3, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2,
                           attention_dropout=0.0, embedding_dropout=0.0, mlp_dropout=0.0, **dims)
    torch.manual_seed(seed)
    hf = ModernBertModel(cfg)
    _finish(hf, seed, path, std)
    _byte_bpe_tokenizer(path, max_len)
    _write_st_files(path, cfg.hidden_size, "mean", True, max_len)
    return TinyModel(name, path, hf, 3, False, "mean", True, False)


def build_mpnet(root: Path, seed: int = 22, name: str = "tiny-mpnet", std: float = 0.1, max_len: int = 128,
                **overrides) -> TinyModel:
    from transformers import MPNetConfig, MPNetModel

    path = _fresh(root, name)
    dims = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
    dims.update(overrides)
    cfg = MPNetConfig(max_position_embeddings=max_len + 2, relative_attention_num_buckets=32, hidden_dropout_prob=0.0,
                      attention_probs_dropout_prob=0.0, pad_token_id=1, bos_token_id=0, eos_token_id=2, **dims)
    torch.manual_seed(seed)
    hf = MPNetModel(cfg, add_pooling_layer=False)
    # Biases of a few units, as trained MPNets have: at std 0.1 a wrong bucket would hide in the parity numbers.
    _finish(hf, seed, path, std, scale={"encoder.relative_attention_bias.weight": 2.0 / std})
    _mpnet_tokenizer(path, max_len)
    _write_st_files(path, cfg.hidden_size, "mean", True, max_len)
    return TinyModel(name, path, hf, 1, False, "mean", True, False)


def build_distilbert(root: Path, seed: int = 23) -> TinyModel:
    """msmarco-distilbert-tas-b style: CLS pooling, not normalized."""
    from transformers import DistilBertConfig, DistilBertModel

    path = _fresh(root, "tiny-distilbert")
    cfg = DistilBertConfig(vocab_size=VOCAB, dim=64, n_layers=2, n_heads=4, hidden_dim=128,
                           max_position_embeddings=64, dropout=0.0, attention_dropout=0.0, pad_token_id=0)
    torch.manual_seed(seed)
    hf = DistilBertModel(cfg)
    _finish(hf, seed, path)
    _bert_tokenizer(path)
    _write_st_files(path, 64, "cls", False, 64)
    return TinyModel("tiny-distilbert", path, hf, 0, False, "cls", False, False)


def build_base_shapes(root: Path) -> dict[str, TinyModel]:
    """ModernBERT-base's and MPNet-base's widths (768 = 12 heads of 64) in 3 / 2 layers, their real window
    (128: 64 each way) and position range (512): the kernels see the real head dim and band widths."""
    return {
        "modernbert-base-shape": build_modernbert(
            root, seed=24, name="modernbert-base-shape", std=0.02, max_len=1024, hidden_size=768,
            intermediate_size=1152, num_hidden_layers=3, num_attention_heads=12, local_attention=128,
            global_rope_theta=160000.0, local_rope_theta=10000.0),
        "mpnet-base-shape": build_mpnet(root, seed=25, name="mpnet-base-shape", std=0.02, max_len=512, hidden_size=768,
                                        num_attention_heads=12, intermediate_size=3072),
    }


ENCODER_FAMILIES = ("modernbert", "mpnet", "distilbert")


def build_encoders(root: Path) -> dict[str, TinyModel]:
    return {"modernbert": build_modernbert(root), "mpnet": build_mpnet(root), "distilbert": build_distilbert(root)}
