"""Byte-level BPE tokenizers of the Qwen2/Qwen3 and Llama-3 kind on ASCII text, their pieces' ids remembered.

Qwen3 (and pplx-embed, Qwen3-Embedding) cut a text with one Split regex (Isolated), map each piece's bytes to
ByteLevel's characters, and run BPE on each piece on its own. On ASCII text that regex's \\p{L}, \\p{N} and \\s are
exactly [A-Za-z], [0-9] and [\\t\\n\\v\\f\\r ], so Python's `re` cuts the same pieces; a piece's ids are then
those of the tokenizer's own BPE model on its ByteLevel characters (`model.tokenize`: the library does the
merges), remembered in rose.word_cache. On this project's CPU a warm ~130-token text takes ~27 µs where
`tokenizers` takes ~130 (`benchmarks/NOTES.md`, "Tokenization").

Exact only where checked by `AsciiByteLevel.of` and tested against `tokenizers` on random ASCII: a normalizer of
NFC / NFD / NFKC / NFKD only (or none: all leave ASCII as it is), the pre-tokenizer exactly that Split regex
(Qwen2's or Llama-3's) then ByteLevel without its own regex or prefix space, a BPE model without dropout, and
every added token printable ASCII without whitespace; a text taken holds printable ASCII, tab, newline and
carriage return only, and no added token's text (case-insensitively; such a text takes the plain path).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from rose.ascii_bert import MAX_ADDED, _plain_token
from rose.word_cache import DEFAULT_CAPACITY, WordCache

_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
          r"\s*[\r\n]+|\s+(?!\S)|\s+")
_LLAMA3 = _QWEN2.replace(r"|\p{N}|", r"|\p{N}{1,3}|")
_UNICODE_NORMS = {"NFC", "NFD", "NFKC", "NFKD"}
_ODD = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")  # control characters other than tab, newline, carriage return


_W = r"\t\n\x0b\x0c\r "  # \s on ASCII, as `tokenizers`' regex engine reads it
_ASCII_QWEN2 = (rf"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\nA-Za-z0-9]?[A-Za-z]+|[0-9]| ?[^{_W}A-Za-z0-9]+[\r\n]*|"
                rf"[{_W}]*[\r\n]+|[{_W}]+(?![^{_W}])|[{_W}]+")
_ASCII = {_QWEN2: _ASCII_QWEN2, _LLAMA3: _ASCII_QWEN2.replace("|[0-9]|", "|[0-9]{1,3}|")}


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> character map, as ByteLevel applies it (printable Latin-1 kept, the rest shifted by 256)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out, n = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return out


class AsciiByteLevel:
    def __init__(self, model, pattern: re.Pattern, added: Sequence[str], cache_words: int) -> None:
        self._model = model  # the tokenizer's BPE model
        self._chars = str.maketrans({chr(b): c for b, c in _bytes_to_unicode().items() if b < 128})
        self.added = tuple(a.lower() for a in added if a)
        self.words = WordCache(self._encode_pieces, cache_words, split=pattern.findall)

    @classmethod
    def of(cls, hf, cache_words: int = DEFAULT_CAPACITY) -> AsciiByteLevel | None:
        """The path for `hf` (a tokenizers.Tokenizer), or None where it would not be exact (or cache_words is 0)."""
        if cache_words <= 0:
            return None
        config = json.loads(hf.to_str())
        norm = config.get("normalizer")
        norms = (norm.get("normalizers", []) if norm.get("type") == "Sequence" else [norm]) if norm else []
        if not all(n.get("type") in _UNICODE_NORMS for n in norms):
            return None
        pre = config.get("pre_tokenizer") or {}
        steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else []
        if len(steps) != 2:
            return None
        split, level = steps
        regex = (split.get("pattern") or {}).get("Regex")
        if (split.get("type") != "Split" or regex not in (_QWEN2, _LLAMA3) or split.get("behavior") != "Isolated"
                or split.get("invert")):
            return None
        if level.get("type") != "ByteLevel" or level.get("use_regex", True) or level.get("add_prefix_space"):
            return None
        model = config.get("model") or {}
        if model.get("type") != "BPE" or model.get("dropout") or model.get("byte_fallback"):
            return None
        added = [t.get("content", "") for t in config.get("added_tokens") or []]
        if len(added) > MAX_ADDED or not all(_plain_token(a) for a in added):
            return None
        return cls(hf.model, re.compile(_ASCII[regex]), added, cache_words)

    def normalized(self, text: str) -> str | None:
        """`text` itself when this path may take it (ASCII, no odd control character, no added token's text)."""
        if not text.isascii() or _ODD.search(text):
            return None
        if self.added:
            low = text.lower()
            if any(a in low for a in self.added):
                return None
        return text

    def _encode_pieces(self, pieces: list[str]) -> list[tuple[int, ...]]:
        tokenize, chars = self._model.tokenize, self._chars
        return [tuple(t.id for t in tokenize(p.translate(chars))) for p in pieces]
