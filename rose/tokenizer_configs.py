"""What a model folder's other configs change in its tokenizer.json, as the libraries that load it do:
tokenizer_config.json's add_bos_token / add_eos_token (transformers 4), sentence_bert_config.json's do_lower_case
(sentence-transformers). rose.tokenizer applies them to the `tokenizers` tokenizer it loads."""

from __future__ import annotations

import json
from pathlib import Path

from rose.spec import ModelFolderError


def config_specials(hf, config_path: Path) -> bool:
    """Add the BOS / EOS that tokenizer_config.json's add_bos_token / add_eos_token ask for and tokenizer.json's
    post-processor does not add; True when it changed the post-processor. Why: folders disagree with
    themselves (e5-mistral: add_eos_token in the config, only <s> in tokenizer.json). transformers 4 rebuilt
    the post-processor from the flags at load, which is how such models were trained and evaluated;
    transformers 5 takes tokenizer.json as it is and drops the EOS that last-token pooling reads (mteb
    fixed its e5-mistral by passing both flags). ROSE keeps the ids the model was trained on."""
    from tokenizers import processors

    cfg = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
    wanted = {side: token_text(cfg.get(f"{side}_token")) for side in ("bos", "eos")
              if cfg.get(f"add_{side}_token") is True}
    wanted = {side: tok for side, tok in wanted.items() if tok is not None}
    if not wanted:
        return False
    content = hf.encode("hello world", add_special_tokens=False).ids
    full = hf.encode("hello world", add_special_tokens=True).ids
    at = next((i for i in range(len(full) - len(content) + 1) if full[i:i + len(content)] == content), None)
    if at is None:
        raise ModelFolderError(f"{config_path}: add_bos/eos_token with a post-processor that changes the content")
    ids = {side: hf.token_to_id(tok) for side, tok in wanted.items()}
    for side, i in ids.items():
        if i is None:
            raise ModelFolderError(f"{config_path}: add_{side}_token names {wanted[side]!r}, not in tokenizer.json")
    prefix, suffix = full[:at], full[at + len(content):]
    new_prefix = ([ids["bos"]] if "bos" in ids and prefix[:1] != [ids["bos"]] else []) + prefix
    new_suffix = suffix + ([ids["eos"]] if "eos" in ids and suffix[-1:] != [ids["eos"]] else [])
    if (new_prefix, new_suffix) == (prefix, suffix):
        return False
    before, after = [hf.id_to_token(i) for i in new_prefix], [hf.id_to_token(i) for i in new_suffix]
    hf.post_processor = processors.TemplateProcessing(
        single=" ".join([*before, "$A", *after]),
        pair=" ".join([*before, "$A", *after, *(f"{t}:1" for t in before), "$B:1", *(f"{t}:1" for t in after)]),
        special_tokens=sorted({(hf.id_to_token(i), i) for i in new_prefix + new_suffix}))
    return True


def lowercase_first(hf) -> bool:
    """sentence_bert_config.json's do_lower_case as sentence-transformers applies it: a Lowercase normalizer put
    before the tokenizer's own unless that is (or holds) one already; True when it changed the tokenizer."""
    from tokenizers import normalizers

    norm = hf.normalizer
    parts = list(norm) if isinstance(norm, normalizers.Sequence) else [norm] if norm is not None else []
    if any(isinstance(n, normalizers.Lowercase) for n in parts):
        return False
    hf.normalizer = normalizers.Sequence([normalizers.Lowercase(), *parts])
    return True


def token_text(value) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, or an AddedToken dict; None for anything else."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None
