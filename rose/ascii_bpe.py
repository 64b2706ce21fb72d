"""Byte-level BPE tokenizers of the Qwen2/Qwen3 and Llama-3 kind on ASCII text, their chunks' ids remembered.

Qwen3 (and pplx-embed, Qwen3-Embedding) cut a text with one Split regex (Isolated), map each piece's bytes to
ByteLevel's characters, and run BPE on each piece on its own. On ASCII text that regex's \\p{L}, \\p{N} and \\s are
exactly [A-Za-z], [0-9] and [\\t\\n\\v\\f\\r ], so Python's `re` cuts the same pieces; a piece's ids are then
those of the tokenizer's own BPE model on its ByteLevel characters (`model.tokenize`: the library does the
merges).

What is remembered (rose.word_cache) is a chunk, not a piece: the text cut before every space followed by a visible
character, so a chunk's ids are the same wherever it stands. Where a visible character precedes the space too, this
is the cut ivy.split_encode proves safe for these regexes (no alternative continues a match from a non-space into
such a space, and the only lookahead sees the same next character). Where whitespace precedes it, no alternative
takes the space with what is before it either: `\\s*[\\r\\n]+` must end on a newline, `\\s+(?!\\S)` gives back a last
space followed by a visible character, plain `\\s+` is tried only where that one fails (at the run's last space
itself), and the optional first character of `[^\\r\\n\\p{L}\\p{N}]?\\p{L}+` must touch the letter; at either side of the
cut the lookahead sees whitespace or the end alike. So indented code and aligned text cut as prose does. The cut is made with `str.replace` and `str.split` (`chunks`), ~6 × faster than the
regex's `findall` over a long text (4096 tokens: ~75 against ~440 µs on this project's CPU); the regex runs only
on new chunks. On this project's CPU a warm ~130-token text takes ~27 µs where `tokenizers` takes ~130
(`benchmarks/NOTES.md`, "Tokenization").

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

from rose.ascii_bert import MAX_ADDED, AddedTexts, _plain_token
from rose.word_cache import DEFAULT_CAPACITY, WordCache

_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
          r"\s*[\r\n]+|\s+(?!\S)|\s+")
_LLAMA3 = _QWEN2.replace(r"|\p{N}|", r"|\p{N}{1,3}|")
_UNICODE_NORMS = {"NFC", "NFD", "NFKC", "NFKD"}
# What this path takes: printable ASCII, tab, newline, carriage return. A text's bytes with these deleted are empty
# (one C pass, ~8 µs over 20 000 characters on this project's CPU, where a regex search for the rest took ~110).
_TAKEN = bytes(range(32, 127)) + b"\t\n\r"


def taken(text: str) -> bool:
    """Whether `text` is made only of the characters this path takes (printable ASCII, tab, newline, CR)."""
    return text.isascii() and not text.encode("ascii").translate(None, _TAKEN)


_KEEP = "\x00"  # stands for a space that is not a cut in `chunks` (no text this path takes holds it: _TAKEN)
_FIRST = "\x01"  # marks a text's first chunk, the one without a space before it (likewise never in a text)


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


def chunks(text: str) -> list[str]:
    """`text` (printable ASCII, tab, newline, carriage return) cut before every space followed by a visible
    character, each other space written _KEEP, the first chunk marked with _FIRST; the others stand for a space and
    themselves (`chunk_text`). C string passes only, on the text reversed (where a space's next character comes
    before it): a space before a tab, newline or carriage return, then the spaces of a run but its last, then one
    at the end."""
    r = text[::-1]
    for ws in "\t\n\r":
        if ws in r:
            r = r.replace(ws + " ", ws + _KEEP)
    if "  " in r:  # a run, here from its last space: every second one but that, then the rest, after kept ones
        r = r.replace("  ", " " + _KEEP)
    if _KEEP in r:
        r = r.replace(_KEEP + " ", _KEEP * 2)
    if r[:1] == " ":
        r = _KEEP + r[1:]
    out = r[::-1].split(" ")
    out[0] = _FIRST + out[0]
    return out


def chunk_text(chunk: str) -> str:
    """The text a chunk of `chunks` stands for."""
    text = chunk[1:] if chunk[:1] == _FIRST else " " + chunk
    return text.replace(_KEEP, " ")


class AsciiByteLevel:
    def __init__(self, model, pattern: re.Pattern, added: Sequence[str], cache_words: int) -> None:
        self._model = model  # the tokenizer's BPE model
        self._pattern = pattern
        self._chars = str.maketrans({chr(b): c for b, c in _bytes_to_unicode().items() if b < 128})
        self.added = AddedTexts(added)
        self.words = WordCache(self._encode_chunks, cache_words, split=chunks)

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
        if not taken(text):
            return None
        if self.added.found(text):
            return None
        return text

    def _encode_chunks(self, new: list[str]) -> list[tuple[int, ...]]:
        """Each chunk's ids: its text cut by the regex, each piece's ByteLevel characters through the BPE model."""
        tokenize, chars, find = self._model.tokenize, self._chars, self._pattern.findall
        return [tuple(t.id for p in find(chunk_text(c)) for t in tokenize(p.translate(chars))) for c in new]
