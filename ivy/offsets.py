"""What the `tokenizers` library's offsets give the routes, apart from the embedding path (which skips them):
text-embeddings-inference's /tokenize tokens with UTF-8 byte offsets, and texts cut to their first (last) k
tokens (Cohere v2's rerank `max_tokens_per_doc`). ivy.tokenization's InputEncoder runs these on its threads."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def byte_offsets(text: str) -> np.ndarray | None:
    """Where each character of `text` starts in its UTF-8 bytes (one entry past the end too), or None for ASCII
    text, whose character offsets are its byte offsets."""
    if text.isascii():
        return None
    points = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    widths = 1 + (points >= 0x80).astype(np.int64) + (points >= 0x800) + (points >= 0x10000)
    return np.concatenate(([0], np.cumsum(widths)))


def simple_tokens(enc, text: str) -> list[dict]:
    """text-embeddings-inference's SimpleTokens of one `tokenizers` Encoding of `text` (core/src/tokenization.rs,
    into_tokens): a special token (special_tokens_mask) its vocabulary string with start / stop null, any other
    the text it covers with its UTF-8 byte offsets."""
    at = byte_offsets(text)
    out = []
    for i, (start, stop), special, token in zip(enc.ids, enc.offsets, enc.special_tokens_mask, enc.tokens):
        if special:
            out.append({"id": i, "text": token, "special": True, "start": None, "stop": None})
        else:
            span = (start, stop) if at is None else (int(at[start]), int(at[stop]))
            out.append({"id": i, "text": text[start:stop], "special": False, "start": span[0], "stop": span[1]})
    return out


def cut_to_tokens(encodings: Sequence, texts: Sequence[str], k: int, side: str) -> list[str]:
    """Each text cut to the span its first k tokens cover (its last k with side "left"), by its Encoding's
    character offsets (special tokens not in them); a text of at most k tokens as it is."""
    out = []
    for text, enc in zip(texts, encodings):
        spans = enc.offsets
        if len(spans) > k:
            text = text[:spans[k - 1][1]] if side == "right" else text[spans[-k][0]:]
        out.append(text)
    return out
