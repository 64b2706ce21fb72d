"""HF model folders for benchmarks: the real configs with random weights, saved where ROSE and the peers load them.

Nothing is downloaded: the Qwen3 configs are written out here (the published Qwen3-0.6B / Qwen3-4B
shapes), weights are random (seeded) in the requested dtype, and the tokenizer is MiniLM's WordPiece
tokenizer.json (benchmarks feed token ids; Ivy's benchmarks tokenize real text with it), or with
`--tokenizer qwen-bpe` a Qwen3-style byte-level BPE trained on the benchmark corpus (write_tokenizer). MiniLM
is all-MiniLM-L6-v2's folder (benchmarks/assets) with random weights. ModernBERT-base, all-mpnet-base-v2 and
distilbert-base-uncased are their published configs with random weights and MiniLM's tokenizer. The decoder
embedders (DECODER_CONFIGS: EmbeddingGemma-300m, gte-Qwen2-1.5B, e5-mistral-7B) get their published configs
and sentence-transformers pipelines the same way (EmbeddingGemma: mean, Dense 768 -> 3072 -> 768, Normalize;
the others: last token).
The cross-encoders, SPLADE and BGE-M3 (HEAD_MODELS) are built by benchmarks.model_zoo_heads.

    python -m benchmarks.model_zoo qwen3-0.6b /tmp/models/qwen3-0.6b [--dtype bfloat16] [--family pplx]
        [--tokenizer qwen-bpe]   (qwen3 and decoder folders)
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

QWEN3_CONFIGS = {
    "qwen3-0.6b": dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                       head_dim=128, intermediate_size=3072, vocab_size=151669, max_position_embeddings=32768,
                       rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True),
    "qwen3-4b": dict(hidden_size=2560, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=128, intermediate_size=9728, vocab_size=151665, max_position_embeddings=32768,
                     rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True),
}
# Encoder families (issue 16): (transformers config and model class, the published config's values over the
# class defaults, sentence-transformers max_seq_length). ModernBERT-base's config is ModernBertConfig's defaults
# (22 layers, local window 128 every layer but each third, RoPE 160k/10k); all-mpnet-base-v2 and
# distilbert-base-uncased as published; bert-large is bert-large-uncased's shape, the shape of bge-large-en-v1.5,
# e5-large-v2 and mxbai-embed-large-v1 (width 1 024, 24 layers).
ENCODER_CONFIGS = {
    "modernbert-base": ("ModernBertConfig", "ModernBertModel", {}, 8192),
    "mpnet-base": ("MPNetConfig", "MPNetModel", dict(vocab_size=30527, max_position_embeddings=514,
                                                     layer_norm_eps=1e-5), 384),
    "distilbert-base": ("DistilBertConfig", "DistilBertModel", {}, 512),
    "bert-large": ("BertConfig", "BertModel", dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                                                   intermediate_size=4096), 512),
}
BERT_LIKE = ("minilm-l6", *ENCODER_CONFIGS)  # short-context encoders: benchmarked on bs1-128 and docs-100
GEMMA3_LAYERS = ["sliding_attention"] * 5 + ["full_attention"]
DECODER_CONFIGS = {  # name -> (transformers model class, config, ST pooling, Dense widths, max_seq_length)
    "embeddinggemma-300m": ("Gemma3TextModel", dict(
        hidden_size=768, num_hidden_layers=24, num_attention_heads=3, num_key_value_heads=1, head_dim=256,
        intermediate_size=1152, vocab_size=262144, max_position_embeddings=2048, query_pre_attn_scalar=256,
        sliding_window=512, layer_types=GEMMA3_LAYERS * 4, use_bidirectional_attention=True,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}},
        hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6),
        "mean", (3072, 768), 2048),
    "gte-qwen2-1.5b": ("Qwen2Model", dict(
        hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2, intermediate_size=8960,
        vocab_size=151646, max_position_embeddings=131072, rope_theta=1000000.0, rms_norm_eps=1e-6,
        use_sliding_window=False), "last", (), 8192),
    "e5-mistral-7b": ("MistralModel", dict(
        hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336,
        vocab_size=32000, max_position_embeddings=32768, rope_theta=10000.0, rms_norm_eps=1e-5, sliding_window=4096),
        "last", (), 4096),
}
HEAD_MODELS = ("ms-marco-minilm-l6", "bge-reranker-v2-m3", "qwen3-reranker-0.6b", "splade-cocondenser",
               "bge-m3")  # model_zoo_heads
REMOTE_NAMES = ("gte-base-en-v1.5", "nomic-embed-text-v1.5")  # = model_zoo_remote.REMOTE_MODELS
MODELS = (*QWEN3_CONFIGS, "minilm-l6", *ENCODER_CONFIGS, *DECODER_CONFIGS, *HEAD_MODELS, *REMOTE_NAMES)


MINILM_SKELETON = Path(__file__).resolve().parent / "assets" / "minilm-l6"  # its files without the weights
TOKENIZERS = ("wordpiece", "qwen-bpe")
QWEN_BPE_VOCAB = 30_000  # a cap: on the corpus the trainer runs out of pairs at 15 244 (each corpus piece one token)
QWEN_EOS = "<|endoftext|>"
BPE_MODELS = (*QWEN3_CONFIGS, *DECODER_CONFIGS)  # the folders that may take --tokenizer qwen-bpe


def _copy_tokenizer(path: Path) -> None:
    """MiniLM's WordPiece tokenizer.json: real text becomes real ids (all < 30522, inside Qwen3's vocabulary),
    [CLS] ... [SEP] around each text, so last-token pooling reads [SEP] as Qwen3-Embedding reads its EOS."""
    data = json.loads((MINILM_SKELETON / "tokenizer.json").read_text())
    data["truncation"] = None
    data["padding"] = None
    path.write_text(json.dumps(data))


def qwen_bpe(vocab_size: int = QWEN_BPE_VOCAB):
    """A Qwen3-style byte-level BPE (benchmarks.tokenize_words.qwen_style_bpe: NFC, Qwen2's Split regex, ByteLevel,
    <|endoftext|> after each text, read by last-token pooling as Qwen3-Embedding reads it) trained on the stack
    benchmark's corpus, so its words are in the vocabulary; the same bytes on every run, in well under a second."""
    from tokenizers import decoders

    from benchmarks.stack.corpus import SNAPSHOT
    from benchmarks.tokenize_words import qwen_style_bpe

    tok = qwen_style_bpe([SNAPSHOT.read_text(encoding="utf-8")], vocab_size=min(vocab_size, QWEN_BPE_VOCAB))
    tok.decoder = decoders.ByteLevel()
    return tok


def write_tokenizer(out: Path, tokenizer: str, max_seq: int, vocab_size: int) -> None:
    """tokenizer.json and tokenizer_config.json: MiniLM's WordPiece (wordpiece) or qwen_bpe (qwen-bpe, at most
    `vocab_size` ids). The config names the generic class, so transformers reads tokenizer.json as it is: the
    model's own class (Qwen2Tokenizer for qwen3) ignores the WordPiece's normalizer/pre-tokenizer, and the
    reference would tokenize differently from Ivy."""
    if tokenizer == "wordpiece":
        _copy_tokenizer(out / "tokenizer.json")
        specials = {"cls_token": "[CLS]", "sep_token": "[SEP]", "unk_token": "[UNK]", "pad_token": "[PAD]"}
    elif tokenizer == "qwen-bpe":
        qwen_bpe(vocab_size).save(str(out / "tokenizer.json"))
        specials = {"eos_token": QWEN_EOS, "pad_token": QWEN_EOS}
    else:
        raise ValueError(f"tokenizer must be one of {', '.join(TOKENIZERS)}, not {tokenizer!r}")
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_seq, **specials}))


def make_qwen3_folder(name: str, out: Path, dtype: str = "bfloat16", family: str = "qwen3", seed: int = 0,
                      tokenizer: str = "wordpiece") -> Path:
    """family: qwen3 (Qwen3-Embedding: causal, last token, normalized) or pplx (bidirectional, mean, int8);
    tokenizer: wordpiece or qwen-bpe (write_tokenizer)."""
    import torch
    from transformers import Qwen3Config, Qwen3Model

    out.mkdir(parents=True, exist_ok=True)
    cfg = dict(QWEN3_CONFIGS[name])
    torch.manual_seed(seed)
    config = Qwen3Config(**cfg, torch_dtype=dtype)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = Qwen3Model(config).to(getattr(torch, dtype))
    for p in model.parameters():  # HF's init leaves norms at 1 and biases 0: fine; scale weights like a trained model
        if p.dim() > 1:
            torch.nn.init.normal_(p, std=0.02)
    model.save_pretrained(out, safe_serialization=True)
    config_json = json.loads((out / "config.json").read_text())
    config_json["rope_theta"] = cfg["rope_theta"]
    if family == "pplx":
        config_json.update(model_type="bidirectional_pplx_qwen3", architectures=["PPLXQwen3Model"],
                           use_bidirectional_attention=True)
        pooling = {"pooling_mode_mean_tokens": True}
        modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                   {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    else:
        pooling = {"pooling_mode_lasttoken": True}
        modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                   {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                   {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]
    (out / "config.json").write_text(json.dumps(config_json, indent=2))
    (out / "modules.json").write_text(json.dumps(modules, indent=2))
    (out / "1_Pooling").mkdir(exist_ok=True)
    (out / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": cfg["hidden_size"], **pooling}))
    (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 32768}))
    write_tokenizer(out, tokenizer, 32768, cfg["vocab_size"])
    del model
    return out


def make_decoder_folder(name: str, out: Path, dtype: str = "bfloat16", seed: int = 0,
                        tokenizer: str = "wordpiece") -> Path:
    """A DECODER_CONFIGS model: random weights (std 0.02; norms as transformers initializes them), its
    sentence-transformers files (Dense weights random too) and MiniLM's tokenizer (ids < 30522 fit every
    vocabulary here; last-token pooling reads [SEP] as these models read their EOS), or qwen-bpe's."""
    import torch
    import transformers
    from safetensors.torch import save_file

    cls_name, cfg, pooling, dense, max_seq = DECODER_CONFIGS[name]
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    cls = getattr(transformers, cls_name)
    config = getattr(transformers, cls_name.replace("Model", "Config"))(**cfg)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = cls(config).to(getattr(torch, dtype))
    for p in model.parameters():
        if p.dim() > 1:
            torch.nn.init.normal_(p, std=0.02)
    model.save_pretrained(out, safe_serialization=True)
    config_json = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config_json, **cfg}, indent=2))  # the published values
    hidden = cfg["hidden_size"]
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    width = hidden
    for i, d_out in enumerate(dense, start=2):
        folder = out / f"{i}_Dense"
        folder.mkdir(exist_ok=True)
        save_file({"linear.weight": (0.02 * torch.randn(d_out, width)).to(getattr(torch, dtype))},
                  str(folder / "model.safetensors"))
        (folder / "config.json").write_text(json.dumps({"in_features": width, "out_features": d_out, "bias": False,
                                                        "activation_function": "torch.nn.modules.linear.Identity"}))
        modules.append({"idx": i, "name": str(i), "path": folder.name, "type": "sentence_transformers.models.Dense"})
        width = d_out
    n = len(modules)
    modules.append({"idx": n, "name": str(n), "path": f"{n}_Normalize", "type": "sentence_transformers.models.Normalize"})
    (out / "modules.json").write_text(json.dumps(modules, indent=2))
    (out / "1_Pooling").mkdir(exist_ok=True)
    (out / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": hidden, "pooling_mode_mean_tokens": pooling == "mean",
         "pooling_mode_lasttoken": pooling == "last"}))
    (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq}))
    write_tokenizer(out, tokenizer, max_seq, cfg["vocab_size"])
    del model
    return out


def make_minilm_folder(out: Path, dtype: str = "bfloat16", seed: int = 0) -> Path:
    """all-MiniLM-L6-v2's config, tokenizer and sentence-transformers files with random weights (the
    real weights are 91 MB, more than travels to the GPU machine; speed does not depend on them)."""
    import torch
    from transformers import BertConfig, BertModel

    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(MINILM_SKELETON, out)
    torch.manual_seed(seed)
    model = BertModel(BertConfig.from_pretrained(out), add_pooling_layer=False).to(getattr(torch, dtype))
    model.save_pretrained(out, safe_serialization=True)
    return out


def save_random_model(out: Path, config_cls: str, model_cls: str, values: dict, dtype: str, seed: int,
                      on_gpu: bool, **model_kwargs):
    """A fresh `out` holding transformers' `model_cls` of `config_cls(**values)` with seeded random weights
    (std 0.02 on every matrix) in `dtype`, drawn on the GPU when `on_gpu` and one is there; returns the config."""
    import torch
    import transformers

    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    torch.manual_seed(seed)
    config = getattr(transformers, config_cls)(**values)
    with torch.device("cuda" if on_gpu and torch.cuda.is_available() else "cpu"):
        model = getattr(transformers, model_cls)(config, **model_kwargs)
        for p in model.parameters():
            if p.dim() > 1:
                torch.nn.init.normal_(p, std=0.02)
    model.to(getattr(torch, dtype)).save_pretrained(out, safe_serialization=True)
    return config


def make_encoder_folder(name: str, out: Path, dtype: str = "bfloat16", seed: int = 0) -> Path:
    """An ENCODER_CONFIGS model with random weights (std 0.02), MiniLM's tokenizer (its ids fit every one of
    these vocabularies) and sentence-transformers files: mean pooling, normalized (as all-mpnet-base-v2)."""
    config_cls, model_cls, values, max_seq = ENCODER_CONFIGS[name]
    extra = {"add_pooling_layer": False} if model_cls in ("MPNetModel", "BertModel") else {}
    config = save_random_model(out, config_cls, model_cls, values, dtype, seed, on_gpu=False, **extra)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]
    (out / "modules.json").write_text(json.dumps(modules, indent=2))
    (out / "1_Pooling").mkdir()
    (out / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": config.hidden_size, "pooling_mode_mean_tokens": True}))
    (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq}))
    _copy_tokenizer(out / "tokenizer.json")
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_seq, "cls_token": "[CLS]",
         "sep_token": "[SEP]", "unk_token": "[UNK]", "pad_token": "[PAD]"}))
    return out


def make_folder(name: str, out: Path, dtype: str = "bfloat16", family: str = "qwen3",
                tokenizer: str = "wordpiece") -> Path:
    """tokenizer: qwen-bpe for a Qwen3 or DECODER_CONFIGS folder (write_tokenizer); the others take wordpiece only."""
    if tokenizer != "wordpiece" and name not in BPE_MODELS:
        raise ValueError(f"tokenizer {tokenizer}: only for {', '.join(BPE_MODELS)}")
    if name == "minilm-l6":
        return make_minilm_folder(out, dtype)
    if name in ENCODER_CONFIGS:
        return make_encoder_folder(name, out, dtype)
    if name in DECODER_CONFIGS:
        return make_decoder_folder(name, out, dtype, tokenizer=tokenizer)
    if name in HEAD_MODELS:  # rerankers, SPLADE, BGE-M3
        from benchmarks.model_zoo_heads import make_head_folder

        return make_head_folder(name, out, dtype)
    from benchmarks.model_zoo_remote import REMOTE_MODELS, make_remote_folder

    if name in REMOTE_MODELS:  # GTE v1.5, NomicBERT: no HF class, ROSE rows only
        return make_remote_folder(name, out, dtype)
    return make_qwen3_folder(name, out, dtype, family, tokenizer=tokenizer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", choices=MODELS)
    parser.add_argument("out", type=Path)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--family", default="qwen3", choices=["qwen3", "pplx"])
    parser.add_argument("--tokenizer", default="wordpiece", choices=TOKENIZERS,
                        help="qwen-bpe: a Qwen3-style byte-level BPE trained on the corpus (qwen3 and decoder folders)")
    args = parser.parse_args()
    if args.tokenizer != "wordpiece" and args.name not in BPE_MODELS:
        parser.error(f"--tokenizer {args.tokenizer}: only for {', '.join(BPE_MODELS)}")
    print(make_folder(args.name, args.out, args.dtype, args.family, args.tokenizer))


if __name__ == "__main__":
    main()
