"""Tiny random decoder embedders in their real folder layouts: EmbeddingGemma (Gemma 3, bidirectional, mean,
Dense 64 -> 128 -> 64, Normalize), gte-Qwen2 (Qwen2, causal, last token) and e5-mistral (Mistral, causal,
last token, a sliding window shorter than the inputs). Each is a transformers config + save_pretrained, a
word-level tokenizer.json with the family's specials and the sentence-transformers files; the reference is
the `transformers` model itself (eager attention) and, for the full pipeline, sentence-transformers.

The windows are small on purpose (Gemma: |q - k| <= 8 on its local layers; Mistral: q - k < 16) so that
the test sequences (up to 64 tokens) cross them: a wrong window shows in the parity numbers.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from rose_tiny_models import VOCAB, WORDS, TinyModel, _randomize, _word_tokenizer, _write_json, _write_st_files

DIMS = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=128, rms_norm_eps=1e-6, attention_dropout=0.0)
IDENTITY = "torch.nn.modules.linear.Identity"
GEMMA3_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},  # transformers 5's layout
               "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}}


def _fresh(root: Path, name: str) -> Path:
    path = root / name
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def _special_tokenizer(path: Path, specials: list[str], single: str, config: dict) -> None:
    """Whole-word ids after `specials` (ids 0..n-1), tokenizer.json post-processor `single`, and
    tokenizer_config.json = the generic fast class plus `config` (special tokens, add_*_token flags)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {t: i for i, t in enumerate(specials + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    used = [t for t in single.split() if t in vocab]
    tok.post_processor = processors.TemplateProcessing(single=single, special_tokens=[(t, vocab[t]) for t in used])
    tok.save(str(path / "tokenizer.json"))
    _write_json(path / "tokenizer_config.json", {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 128,
                                                  "unk_token": "<unk>", **config})


def _finish(hf: torch.nn.Module) -> torch.nn.Module:
    hf.config._attn_implementation = "eager"  # the reference: an implementation independent of ours
    return hf.eval()


def build_qwen2(root: Path, seed: int = 31, name: str = "tiny-gte-qwen2", overrides: dict | None = None,
                std: float = 0.1) -> TinyModel:
    """gte-Qwen2 style: Qwen2 (biases on q/k/v), causal, last token of `... <|endoftext|>`, normalized."""
    from transformers import Qwen2Config, Qwen2Model

    path = _fresh(root, name)
    dims = {**DIMS, "num_hidden_layers": 2, "rope_theta": 10000.0, **(overrides or {})}
    cfg = Qwen2Config(use_sliding_window=False, tie_word_embeddings=False, **dims)
    torch.manual_seed(seed)
    hf = Qwen2Model(cfg)
    _randomize(hf, seed, std)
    hf.save_pretrained(path, safe_serialization=True)
    _word_tokenizer(path, eos_suffix=True)
    _write_st_files(path, cfg.hidden_size, "last", True, cfg.max_position_embeddings,
                    prompts={"query": "Instruct: find it\nQuery: ", "document": ""})
    return TinyModel(name, path, _finish(hf), 0, False, "last", True, False)


def build_mistral(root: Path, seed: int = 32, name: str = "tiny-e5-mistral", overrides: dict | None = None,
                  std: float = 0.1) -> TinyModel:
    """e5-mistral style: Mistral, causal, a sliding window, last token; tokenizer.json adds only <s> while
    tokenizer_config.json asks for <s> and </s> (as e5-mistral's folder does)."""
    from transformers import MistralConfig, MistralModel

    path = _fresh(root, name)
    dims = {**DIMS, "num_hidden_layers": 2, "head_dim": 16, "rope_theta": 10000.0, "sliding_window": 16,
            **(overrides or {})}
    cfg = MistralConfig(tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, **dims)
    torch.manual_seed(seed)
    hf = MistralModel(cfg)
    _randomize(hf, seed, std)
    hf.save_pretrained(path, safe_serialization=True)
    _special_tokenizer(path, ["<unk>", "<s>", "</s>"], "<s> $A",
                       {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True, "add_eos_token": True})
    _write_st_files(path, cfg.hidden_size, "last", True, cfg.max_position_embeddings,
                    prompts={"query": "Instruct: find it\nQuery: ", "document": ""})
    return TinyModel(name, path, _finish(hf), 0, False, "last", True, False)


def build_gemma3(root: Path, seed: int = 33, name: str = "tiny-embeddinggemma", overrides: dict | None = None,
                 std: float = 0.1) -> TinyModel:
    """EmbeddingGemma style: Gemma 3 text, bidirectional (local layers |q - k| <= 8), mean pooling, Dense
    hidden -> 2 hidden -> hidden without bias or activation, Normalize; `<bos> ... <eos>` around every input."""
    from safetensors.torch import save_file
    from transformers import Gemma3TextConfig, Gemma3TextModel

    path = _fresh(root, name)
    dims = {**DIMS, "num_hidden_layers": 3, "head_dim": 16, "query_pre_attn_scalar": 24, "sliding_window": 16,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention"], **(overrides or {})}
    cfg = Gemma3TextConfig(rope_parameters=GEMMA3_ROPE, use_bidirectional_attention=True,
                           hidden_activation="gelu_pytorch_tanh", pad_token_id=0, eos_token_id=1, bos_token_id=2,
                           **dims)
    hidden, window = cfg.hidden_size, dims["sliding_window"]
    torch.manual_seed(seed)
    model = Gemma3TextModel(cfg)
    _randomize(model, seed, std)
    with torch.no_grad():  # Gemma's norms scale by (1 + weight): centre the weights on 0, as trained ones are
        for name, p in model.named_parameters():
            if "norm" in name:
                p.sub_(1.0)
    model.save_pretrained(path, safe_serialization=True)
    # The configured window, as the Hub's config.json holds it (transformers halves it on every load;
    # some releases wrote the halved value back on save)
    config = json.loads((path / "config.json").read_text())
    _write_json(path / "config.json", {**config, "sliding_window": window})
    hf = Gemma3TextModel.from_pretrained(path)  # the reference reads the very file ROSE reads
    _special_tokenizer(path, ["<pad>", "<eos>", "<bos>", "<unk>"], "<bos> $A <eos>",
                       {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "add_bos_token": True,
                        "add_eos_token": True})
    _write_st_files(path, hidden, "mean", False, cfg.max_position_embeddings,
                    prompts={"query": "task: search result | query: ", "document": "title: none | text: "})
    gen = torch.Generator().manual_seed(seed)
    modules = json.loads((path / "modules.json").read_text())
    dense = []
    for i, (d_in, d_out) in enumerate(((hidden, 2 * hidden), (2 * hidden, hidden)), start=2):
        weight = 1.2 * d_in ** -0.5 * torch.randn(d_out, d_in, generator=gen)
        (path / f"{i}_Dense").mkdir()
        save_file({"linear.weight": weight}, str(path / f"{i}_Dense" / "model.safetensors"))
        _write_json(path / f"{i}_Dense" / "config.json", {"in_features": d_in, "out_features": d_out, "bias": False,
                                                          "activation_function": IDENTITY})
        modules.append({"idx": i, "name": str(i), "path": f"{i}_Dense", "type": "sentence_transformers.models.Dense"})
        dense.append(weight)
    modules.append({"idx": 4, "name": "4", "path": "4_Normalize", "type": "sentence_transformers.models.Normalize"})
    _write_json(path / "modules.json", modules)
    return TinyModel(name, path, _finish(hf), 0, False, "mean", True, False, dense=tuple(dense))


def build_decoders(root: Path) -> dict[str, TinyModel]:
    """The decoder families, keyed by a short name."""
    return {"gemma3": build_gemma3(root), "qwen2": build_qwen2(root), "mistral": build_mistral(root)}


def build_real_widths(root: Path) -> dict[str, TinyModel]:
    """Two layers each at the real models' attention shapes, so the kernels see the real head dims, GQA
    ratios and windows (GPU tests): EmbeddingGemma-300m (3 query heads, 1 KV head of 256, window 512 ->
    |q - k| <= 256), gte-Qwen2-1.5B (12 / 2 heads of 128), e5-mistral-7B (32 / 8 heads of 128; its window
    4096 covers every input it takes, so a 256 window here makes the local kernel run; one layer of 7B widths)."""
    long = {"max_position_embeddings": 1024}
    models = {
        "gemma3-300m-shape": build_gemma3(root, 41, "embeddinggemma-300m-shape", std=0.02, overrides={
            **long, "hidden_size": 768, "intermediate_size": 1152, "num_attention_heads": 3, "num_key_value_heads": 1,
            "head_dim": 256, "query_pre_attn_scalar": 256, "sliding_window": 512, "num_hidden_layers": 2,
            "layer_types": ["sliding_attention", "full_attention"]}),
        "qwen2-1.5b-shape": build_qwen2(root, 42, "gte-qwen2-1.5b-shape", std=0.02, overrides={
            **long, "hidden_size": 1536, "intermediate_size": 8960, "num_attention_heads": 12,
            "num_key_value_heads": 2, "rope_theta": 1000000.0}),
        "mistral-7b-shape": build_mistral(root, 43, "e5-mistral-7b-shape", std=0.02, overrides={
            **long, "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
            "num_key_value_heads": 8, "head_dim": 128, "sliding_window": 256, "num_hidden_layers": 1}),
    }
    for tiny in models.values():  # the word tokenizers' configs cap inputs at 128 tokens
        tok_config = tiny.path / "tokenizer_config.json"
        _write_json(tok_config, {**json.loads(tok_config.read_text()), "model_max_length": 1024})
    return models
