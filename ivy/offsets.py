"""What the `tokenizers` library's offsets give the routes, apart from the embedding path (which skips them):
text-embeddings-inference's /tokenize tokens with UTF-8 byte offsets, and texts cut to their first (last) k
tokens (Cohere v2's rerank `max_tokens_per_doc`). ivy.tokenization's InputEncoder runs these on its threads."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import orjson


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
    return _simple_tokens(_columns(enc), byte_offsets(text), text, 0, len(enc.ids))


def _columns(enc) -> tuple[list, list, list, list]:
    """An Encoding's ids, offsets, special-token mask and tokens, each a list made once (every attribute read
    builds its whole list anew)."""
    return enc.ids, enc.offsets, enc.special_tokens_mask, enc.tokens


def _simple_tokens(columns: tuple, at: np.ndarray | None, text: str, start: int, stop: int) -> list[dict]:
    ids, spans, special, tokens = columns
    out = []
    for k in range(start, min(stop, len(ids))):
        if special[k]:
            out.append({"id": ids[k], "text": tokens[k], "special": True, "start": None, "stop": None})
        else:
            begin, end = spans[k]
            where = (begin, end) if at is None else (int(at[begin]), int(at[end]))
            out.append({"id": ids[k], "text": text[begin:end], "special": False, "start": where[0], "stop": where[1]})
    return out


JSON_CHUNK = 4096  # tokens a step of simple_tokens_json: ~1 ms of the GIL on this VM, its dicts freed before the next


def simple_tokens_json(enc, text: str) -> bytes:
    """simple_tokens as JSON bytes, built JSON_CHUNK tokens at a time, so that the thread doing it (a tokenizer
    thread) never holds the GIL long in one stretch: neither one orjson call over a long text's tokens nor the
    freeing of all their dicts at once (the event loop shares the GIL: it was held 440 ms in one stretch for a
    2 MB body's two million tokens, before /tokenize's cap a request)."""
    columns, at = _columns(enc), byte_offsets(text)
    n = len(columns[0])
    parts = [orjson.dumps(_simple_tokens(columns, at, text, k, k + JSON_CHUNK))[1:-1] for k in range(0, n, JSON_CHUNK)]
    return b"[" + b",".join(parts) + b"]"


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
