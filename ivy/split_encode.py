"""A long text encoded on several cores, in pieces cut where the tokenizer splits anyway.

HF `tokenizers` encodes one text on one thread (~0.4 M tokens/s: 4096 tokens ≈ 10 ms, most of the stack's
added latency at that length). A text longer than `split_chars` is cut into pieces at boundaries that the
tokenizer's own pre-tokenizer never merges across, the pieces are encoded without special tokens in
parallel, merged, then truncated and wrapped with the model's special tokens exactly as the plain path does
(rose.tokenizer.Tokenizer.finish): the ids are the plain encode's. In parallel means one encode_batch
call over the pieces (parallel inside `tokenizers`, on its rayon pool) while TOKENIZERS_PARALLELISM allows
it, else the pieces spread over the encoder's pool (the GIL is released inside `tokenizers`); at most
`threads` pieces per text either way. On the 16-core GPU host (benchmarks/tokenize_parallel.py), one text of
4096 MiniLM tokens: 8.1 ms whole, 1.70 ms in 8 pieces in one call, 1.76 ms on 8 Python threads (2.35 ms
with TOKENIZERS_PARALLELISM=false), 1.26 ms in 16 pieces. Only tokenizers whose every stage is known to be
safe at those boundaries are split (`split_rule`); any other stage, or a text without a safe boundary, is
encoded whole.

Boundaries, per rule:
- "ws" (BertPreTokenizer, Whitespace, WhitespaceSplit: whitespace is dropped): before any ASCII space,
  tab, CR or LF. Every allowed normalizer maps those to whitespace and acts per character elsewhere
  (Unicode composition never crosses a whitespace starter).
- "space" (byte-level BPE: GPT-2's ByteLevel regex, or the Qwen2/Qwen3 or Llama-3 Split regex before a
  regex-free ByteLevel): before a single ASCII space between two visible characters. No alternative of
  those regexes continues a match from a non-space into a space, none looks behind, and the only
  lookahead, `\\s+(?!\\S)`, sees the same next character; so the pre-tokens are the same, the space
  staying with the following word. An added token that strips whitespace on its right would eat that
  space in the whole text but not in the piece: such tokenizers are not split.
Not split: SentencePiece models, Metaspace (its prepend scheme and split flag decide what a piece's first
word becomes: not proven here, and XLM-R's folders use a Precompiled normalizer anyway), Precompiled /
Replace / Strip / Prepend normalizers, any other pre-tokenizer or Split regex, BPE dropout, and added tokens
containing whitespace.
"""

from __future__ import annotations

import json
import os
import re
import threading
import unicodedata
from concurrent.futures import Executor
from typing import Sequence

from rose.tokenizer import Encoded, Tokenizer, as_arrays

_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
          r"\s*[\r\n]+|\s+(?!\S)|\s+")
_LLAMA3 = _QWEN2.replace(r"|\p{N}|", r"|\p{N}{1,3}|")
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_SAFE_REGEXES = {_QWEN2, _LLAMA3, _GPT2}
_CHAR_NORMALIZERS = {"NFC", "NFD", "NFKC", "NFKD", "Lowercase", "StripAccents"}
_WS_SPLITTERS = {"BertPreTokenizer", "Whitespace", "WhitespaceSplit"}
_PER_SPLIT = _WS_SPLITTERS | {"Punctuation", "Digits"}  # act inside each split, never across
_MODELS = {"WordPiece", "BPE", "WordLevel", "Unigram"}

_SERIAL = {"", "off", "false", "f", "no", "n", "0"}  # tokenizers' own reading of TOKENIZERS_PARALLELISM
_CUT = {"ws": re.compile(r"[ \t\n\r]"), "space": re.compile(r"(?<=\S) (?=\S)")}


def _normalizer_ok(norm: dict | None, bert_ok: bool) -> bool:
    if norm is None:
        return True
    kind = norm.get("type")
    if kind == "Sequence":
        return all(_normalizer_ok(n, bert_ok) for n in norm.get("normalizers", []))
    return kind in _CHAR_NORMALIZERS or (bert_ok and kind == "BertNormalizer")


def _pre_rule(pre: dict | None) -> str | None:
    if pre is None:
        return None
    kind = pre.get("type")
    if kind in _WS_SPLITTERS:
        return "ws"
    if kind == "ByteLevel" and pre.get("use_regex", True):
        return "space"
    if kind != "Sequence":
        return None
    steps = pre.get("pretokenizers", [])
    if steps and steps[0].get("type") in _WS_SPLITTERS and all(s.get("type") in _PER_SPLIT for s in steps[1:]):
        return "ws"
    if (len(steps) == 2 and steps[0].get("type") == "Split" and steps[0].get("behavior") == "Isolated"
            and not steps[0].get("invert") and steps[0].get("pattern", {}).get("Regex") in _SAFE_REGEXES
            and steps[1].get("type") == "ByteLevel" and not steps[1].get("use_regex", True)):
        return "space"
    return None


def split_rule(tokenizer: Tokenizer) -> str | None:
    """'ws' or 'space' (the boundaries above) when every stage of the tokenizer is known safe, else None."""
    if tokenizer.hf is None:
        return None
    data = json.loads(tokenizer.hf.to_str())
    model = data.get("model") or {}
    if model.get("type") not in _MODELS or model.get("dropout") not in (None, 0, 0.0):
        return None
    rule = _pre_rule(data.get("pre_tokenizer"))
    if rule is None or not _normalizer_ok(data.get("normalizer"), bert_ok=rule == "ws"):
        return None
    for tok in data.get("added_tokens", []):
        if any(c.isspace() for c in tok.get("content", "")) or (rule == "space" and tok.get("rstrip")):
            return None
    return rule


def _visible(c: str) -> bool:
    """Neither whitespace, nor a mark, control or separator, nor decomposing to one (NFKD of '´' is ' ́')."""
    if unicodedata.category(c)[0] in "CMZ":
        return False
    return not any(d.isspace() or unicodedata.category(d)[0] in "CZ" for d in unicodedata.normalize("NFKD", c))


def cut(text: str, rule: str, pieces: int) -> list[str] | None:
    """`text` in at most `pieces` parts of about equal length, cut at `rule`'s boundaries; None if none."""
    pattern = _CUT[rule]
    out, start = [], 0
    for j in range(1, pieces):
        pos = max(start + 1, j * len(text) // pieces)
        m = pattern.search(text, pos)
        while m is not None and rule == "space" and not (_visible(text[m.start() - 1])
                                                          and _visible(text[m.start() + 1])):
            m = pattern.search(text, m.start() + 1)
        if m is None:
            break
        out.append(text[start:m.start()])
        start = m.start()
    if not out:
        return None
    out.append(text[start:])
    return out


class SplitEncoder:
    """Tokenizer.encode_batch, with texts over `split_chars` characters cut into pieces of about
    `piece_chars` (at most `threads` per text) and the work spread over `pool`. threads <= 1 or
    split_chars <= 0, or a tokenizer without a split rule: exactly Tokenizer.encode_batch. In a call of many
    texts only those longer than twice the call's characters per thread are cut (encode_batch spreads the texts
    over the cores already: a hundred documents alike need no cutting, one long document among short queries does).
    A call small enough to run on the event loop (ivy.tokenization's inline_chars) is cut there too: the pieces
    run on tokenizers' own threads, so the loop waits less than for one whole encode."""

    def __init__(self, tokenizer: Tokenizer, pool: Executor | None, threads: int, *, split_chars: int = 1000,
                 piece_chars: int = 500, mode: str = "auto") -> None:
        self.tokenizer = tokenizer
        self.mode = mode  # "rust": one encode_batch over the pieces; "pool": groups on `pool`; "auto": either
        self.pool = pool
        self.threads = max(1, threads)
        self.split_chars = split_chars
        self.piece_chars = max(1, piece_chars)
        self.rule = split_rule(tokenizer) if split_chars > 0 and self.threads > 1 and pool is not None else None

    def pieces(self, text: str, bound: int = 0, whole_ok: bool = True) -> list[str] | None:
        """`text` cut for encoding when it is longer than split_chars and `bound`; None: encode it whole (also
        where the tokenizer's word cache takes it: faster whole than in pieces, Tokenizer.takes_whole; whole_ok
        False: cut even then, for a text the cache has refused)."""
        if self.rule is None or len(text) <= max(self.split_chars, bound) or (
                whole_ok and self.tokenizer.takes_whole(text)):
            return None
        n = min(self.threads, -(-len(text) // self.piece_chars))
        return cut(text, self.rule, n) if n > 1 else None

    def encode_batch(self, texts: Sequence[str], max_length: int | None = None, side: str = "right", *,
                     arrays: bool = False) -> list[Encoded]:
        """arrays: each Encoded's ids an int32 array (rose.tokenizer.Tokenizer.encode_batch)."""
        if self.rule is None:
            return self.tokenizer.encode_batch(texts, max_length, side, arrays=arrays)
        # Several texts: cut only one longer than twice the call's characters per thread (it would outlast the rest)
        bound = 2 * sum(map(len, texts)) // self.threads if len(texts) > 1 else 0
        split = [self.pieces(t, bound) for t in texts]
        if not any(split):
            # The texts the word cache refuses (mostly new words, or not its kind) come back to be cut like any
            # other: a cold 4096-token text whole on one thread took ~8 ms on the H200 host, in 8 pieces ~1.7.
            def refused(rest: list[str]) -> list:
                return [enc.ids for enc in self._merged(rest, [self.pieces(t, bound, whole_ok=False) for t in rest])]

            return self.tokenizer.encode_batch(texts, max_length, side, arrays=arrays, rest=refused)
        out = [self.tokenizer.finish(enc, max_length, side) for enc in self._merged(texts, split)]
        return [as_arrays(e) for e in out] if arrays else out

    def _merged(self, texts: Sequence[str], split: list[list[str] | None]) -> list:
        """Each text's content Encoding: the texts whole and the pieces of those cut (`split`), in one call."""
        units = [p for t, s in zip(texts, split) for p in (s or [t])]
        encodings = self.tokenizer.content_encodings(units) if self._rust() else self._encode_parallel(units)
        out, i = [], 0
        for s in split:
            k = len(s) if s else 1
            out.append(self.tokenizer.merge(encodings[i:i + k]))
            i += k
        return out

    def _rust(self) -> bool:
        if self.mode == "auto":
            return os.environ.get("TOKENIZERS_PARALLELISM", "true").strip().lower() not in _SERIAL
        return self.mode == "rust"

    def _encode_parallel(self, units: list[str]) -> list:
        """content_encodings(units), in up to `threads` groups of about equal characters. This thread takes
        groups too and waits only for groups another thread has started: no deadlock when the pool is busy
        (helpers still queued when the work is done are cancelled or find nothing)."""
        groups = _groups(units, self.threads)
        results: list = [None] * len(groups)
        state = {"next": 0, "left": len(groups), "error": None}
        done = threading.Condition()

        def work() -> None:
            while True:
                with done:
                    i = state["next"]
                    if i >= len(groups):
                        return
                    state["next"] = i + 1
                try:
                    results[i] = self.tokenizer.content_encodings(units[groups[i][0]:groups[i][1]])
                except BaseException as exc:  # re-raised on the calling thread
                    state["error"] = exc
                with done:
                    state["left"] -= 1
                    done.notify_all()

        helpers = [self.pool.submit(work) for _ in range(len(groups) - 1)]
        work()
        for h in helpers:
            h.cancel()
        with done:
            done.wait_for(lambda: state["left"] == 0)
        if state["error"] is not None:
            raise state["error"]
        return [enc for group in results for enc in group]


def _groups(units: list[str], k: int) -> list[tuple[int, int]]:
    """Contiguous [start, end) ranges of `units`, at most k, of about equal total length."""
    total = sum(map(len, units)) or 1
    k = min(k, len(units))
    bounds, acc, start = [], 0, 0
    for i, u in enumerate(units):
        acc += len(u)
        if len(bounds) < k - 1 and acc * k >= total * (len(bounds) + 1) and i + 1 < len(units):
            bounds.append((start, i + 1))
            start = i + 1
    bounds.append((start, len(units)))
    return bounds
