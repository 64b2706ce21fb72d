"""BERT's normalizer done in Python for ASCII text: the same ids as `tokenizers`, ~100 µs sooner at 128 tokens.

`tokenizers` runs BertNormalizer (clean_text, lowercase, strip accents, spaces around CJK) through its
NormalizedString, which keeps an alignment per character: 104 µs of the 257 µs that all-MiniLM-L6-v2's
tokenizer takes for a 640-character text on this project's CPU (benchmarks/NOTES.md, "Tokenization"). On ASCII
text three of the four steps do nothing (no accents, no CJK) and the other two are a character table and
`str.lower()`, a few µs in C. So a text that is ASCII is normalized here and encoded by a copy of the tokenizer
without its normalizer; any other text goes through the tokenizer as it is.

Exact by construction and tested against the plain tokenizer on random ASCII (control characters, every kind
of whitespace, case, punctuation). Two limits keep it so: only a normalizer that is exactly a BertNormalizer
qualifies, and a text in which an added token's text appears (case-insensitively: "[SEP]", "[mask]") takes the
plain path, because `tokenizers` matches added tokens before or after normalizing by each token's flag.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from itertools import accumulate

from rose.word_cache import DEFAULT_CAPACITY, WordCache

# BertNormalizer's clean_text on ASCII: NUL and the control characters (category Cc) other than tab, newline
# and carriage return are removed; those three (whitespace to it) become a space. DEL is Cc too.
_CLEAN = {c: None for c in (*range(9), 11, 12, *range(14, 32), 127)}
_CLEAN.update({9: 32, 10: 32, 13: 32})
MAX_ADDED = 64  # more added tokens than this: the per-text search would cost what the path saves


GROUP_CHARS = 1000  # new words are encoded in groups of about this many characters, in parallel


def words_by_offsets(encode: Callable) -> Callable[[list[str]], list[tuple[int, ...]]]:
    """rose.word_cache's encode_words for BERT: new words joined by spaces, in groups of about GROUP_CHARS
    characters, in one batch call of `encode` (texts -> Encodings with offsets, content only, no normalizer;
    parallel inside `tokenizers`: a batch item per word costs ~3 × more at a hundred words); each token belongs to
    the word its first character falls in."""

    def encode_words(new: list[str]) -> list[tuple[int, ...]]:
        groups, size, start = [], 0, 0
        for i, w in enumerate(new):
            size += len(w) + 1
            if size >= GROUP_CHARS:
                groups.append(new[start:i + 1])
                size, start = 0, i + 1
        if start < len(new):
            groups.append(new[start:])
        out: list[tuple[int, ...]] = []
        for group, enc in zip(groups, encode([" ".join(g) for g in groups])):
            ends = list(accumulate(len(w) + 1 for w in group))
            ids: list[list[int]] = [[] for _ in group]
            j = 0
            for token, (first, _) in zip(enc.ids, enc.offsets):
                while first >= ends[j]:
                    j += 1
                ids[j].append(token)
            out.extend(map(tuple, ids))
        return out

    return encode_words


class AddedTexts:
    """Whether a text holds an added token's text, case-insensitively, searched only where its first character
    is in the text: one C search of the text for each distinct first character (~0.2 µs over 20 000 characters on
    this project's CPU) instead of a search of the lowercased text for every token (~6 µs each; Qwen3's folders
    add 26, all starting with "<", BERT's five start with "[")."""

    def __init__(self, added: Sequence[str]) -> None:
        self.lowered = tuple(dict.fromkeys(a.lower() for a in added if a))
        groups: dict[str, list[str]] = {}
        for a in self.lowered:
            groups.setdefault(a[0], []).append(a)
        # a letter's group is searched for under both cases (the token matches case-insensitively)
        self._groups = tuple((tuple({c, c.upper()}), tuple(tokens)) for c, tokens in groups.items())

    def __bool__(self) -> bool:
        return bool(self.lowered)

    def found(self, text: str, low: str | None = None) -> bool:
        """An added token's text is in `text` (`low`: text.lower(), if the caller has it)."""
        for firsts, tokens in self._groups:
            if any(c in text for c in firsts):
                if low is None:
                    low = text.lower()
                if any(a in low for a in tokens):
                    return True
        return False


def _plain_token(content: str) -> bool:
    """An added token this path can rule out by a search of the normalized, lowercased text: printable ASCII
    without whitespace, which cleaning never changes and which `tokenizers` matches, before or after normalizing,
    only where that search finds it too. ("\\t" or "Café" would be matched where the search cannot see them; a
    token with a space could span the words that rose.word_cache joins.)"""
    return content.isascii() and content.isprintable() and " " not in content


class AsciiBert:
    def __init__(self, bare, clean: bool, lowercase: bool, added: Sequence[str]) -> None:
        self.bare = bare  # the tokenizer without its normalizer
        self._encode_bare = getattr(bare, "encode_batch_fast", bare.encode_batch)  # no offsets, as rose.tokenizer
        self.clean = clean
        self.lowercase = lowercase
        self.added = AddedTexts(added)
        self.words: WordCache | None = None  # words' ids remembered (rose.word_cache), where exact

    @classmethod
    def of(cls, hf, cache_words: int = DEFAULT_CAPACITY) -> AsciiBert | None:
        """The path for `hf` (a tokenizers.Tokenizer, truncation and padding off), or None when its normalizer
        is not exactly a BertNormalizer, or it has too many added tokens or one that is not plain. cache_words: how many words' ids
        rose.word_cache may remember (0: none)."""
        config = json.loads(hf.to_str())
        norm = config.get("normalizer") or {}
        if norm.get("type") != "BertNormalizer" or set(norm) - {"type", "clean_text", "handle_chinese_chars",
                                                                   "strip_accents", "lowercase"}:
            return None
        added = [t.get("content", "") for t in config.get("added_tokens") or []]
        if len(added) > MAX_ADDED or not all(_plain_token(a) for a in added):
            return None
        config["normalizer"] = None
        from tokenizers import Tokenizer

        bare = Tokenizer.from_str(json.dumps(config))
        bare.no_truncation()
        bare.no_padding()
        path = cls(bare, bool(norm.get("clean_text", True)), bool(norm.get("lowercase", True)), added)
        # The word cache is exact only with clean_text (no control character left, the space the only
        # whitespace), exactly BertPreTokenizer and WordPiece (rose.word_cache)
        if (cache_words > 0 and path.clean and config.get("pre_tokenizer") == {"type": "BertPreTokenizer"}
                and (config.get("model") or {}).get("type") == "WordPiece"):
            path.words = WordCache(words_by_offsets(lambda texts: bare.encode_batch(texts, add_special_tokens=False)),
                                   cache_words)
        return path

    def normalized(self, text: str) -> str | None:
        """`text` as BertNormalizer writes it, or None when this path must not take it (not ASCII, or an added
        token's text in it)."""
        if not text.isascii():
            return None
        if self.clean:
            text = text.translate(_CLEAN)
        low = text.lower()
        if self.added.found(text, low):
            return None
        return low if self.lowercase else text

    def encode_many(self, plain, texts: list[str], **kwargs) -> list:
        """`tokenizers` Encodings of `texts` (content only when kwargs say so) with the ids of `plain` (the full
        tokenizer's batch encode): the ASCII ones through the bare tokenizer, the rest through `plain`, each group
        in one batch call, in the input's order."""
        fast = self._encode_bare
        normal = [self.normalized(t) for t in texts]
        if all(n is not None for n in normal):
            return fast(normal, **kwargs)
        if all(n is None for n in normal):
            return plain(list(texts), **kwargs)
        out: list = [None] * len(texts)
        mine = [i for i, n in enumerate(normal) if n is not None]
        rest = [i for i, n in enumerate(normal) if n is None]
        for i, enc in zip(mine, fast([normal[i] for i in mine], **kwargs)):
            out[i] = enc
        for i, enc in zip(rest, plain([texts[i] for i in rest], **kwargs)):
            out[i] = enc
        return out
