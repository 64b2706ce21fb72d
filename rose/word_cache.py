"""The ids of whitespace-separated words remembered, for BERT's tokenizers on ASCII text: ~6 × fewer µs a text.

BertPreTokenizer cuts a text at whitespace, then around each punctuation character, and WordPiece maps each
piece to ids on its own. So a whitespace-separated word of a normalized text ("server's", "x86_64,") has the
same ids wherever it stands, and a text's content ids are its words' ids one after another. rose.ascii_bert
normalizes an ASCII text; here it is cut with `str.split()`, each word's ids are looked up, and the words not
seen yet are encoded in one call of the tokenizer without its normalizer, joined by spaces (the library still
does all of the tokenizing; ids are only remembered). On this project's CPU a warm 128-token text takes ~17 µs
where `tokenizers` takes ~140 (`python -m benchmarks.tokenize_words`).

Exact only under these conditions, checked by rose.ascii_bert's `AsciiBert.of`, and tested against
`tokenizers` on random ASCII:
- the normalizer is a BertNormalizer with clean_text, so a normalized ASCII text holds no control character and
  its only whitespace is the space, which `str.split()` and BertPreTokenizer both cut at;
- the pre-tokenizer is exactly BertPreTokenizer (nothing after it that could join words);
- the model is WordPiece (per word, no state between words);
- every added token is printable ASCII without whitespace (rose.ascii_bert refuses other tokenizers), and a text
  holding one's text takes the plain path: so no word, nor words joined by spaces, can hold one.

Cost and memory against a client sending words never seen: a call with more than LEARN_PER_CALL new words, and
more than half of its words new, is encoded by the plain path (its ids in one `tokenizers` call) and only
the first LEARN_PER_CALL of them to appear are learned: 2 000 random hex words took ~1.1 × the plain path's time
on this project's CPU (2.2 × when every new word was learned). A cold short text, whose new words are all
learned, takes ~1.5–1.8 × the plain path's time once. At most `capacity` words are remembered (65 536 by
default), each of at most MAX_WORD_CHARS characters, with at most `capacity` × IDS_PER_WORD ids in all; full, the
cache starts again empty. A word of many ids ("----------" under a heading, a URL) is remembered like any other:
one such word left out sent its whole text down the slow path on every call.

A word's ids are kept as native int32 bytes and a text's ids come back as one int32 array, read off a
`bytes.join` of its words' bytes: no Python int per token is made, and the array goes to the wire as it is
(ivy.encode.packed_ids). At 4096 tokens on this project's CPU: the lookup 142 → 86 µs, the packing 60 → ~2.
"""

from __future__ import annotations

import threading
from array import array
from collections.abc import Callable, Sequence
from itertools import chain

import numpy as np

MAX_WORD_CHARS = 100  # longer words are encoded every time, not remembered (WordPiece gives such a piece one [UNK])
IDS_PER_WORD = 8  # the ids held in all: at most capacity × this (ordinary words have 1-3)
DEFAULT_CAPACITY = 1 << 16
LEARN_PER_CALL = 64  # a call with more new words than this, and more than half of its words, takes the plain path
WARM_NEW_WORDS = 32  # rose.tokenizer's encode_warm learns at most this many new words (on the caller's thread),
WARM_NEW_CHARS = 1024  # of at most this many characters in all
_INT32 = "i"  # array's C int: 4 bytes wherever numpy and torch are built
assert array(_INT32).itemsize == 4


def _packed(ids: Sequence[int]) -> bytes:
    return array(_INT32, ids).tobytes()


def _as_array(joined: bytes) -> np.ndarray:
    """A text's ids, int32, read-only (they share the joined bytes)."""
    return np.frombuffer(joined, dtype=np.int32)


class WordCache:
    def __init__(self, encode_words: Callable[[list[str]], list[tuple[int, ...]]],
                 capacity: int = DEFAULT_CAPACITY, *, split: Callable[[str], list[str]] = str.split) -> None:
        """encode_words: new words -> their ids (rose.ascii_bert.words_by_offsets, rose.ascii_bpe's pieces);
        split: a normalized text -> its words."""
        self._encode_words = encode_words
        self._split = split
        self.capacity = capacity
        self.max_ids = capacity * IDS_PER_WORD
        self._ids: dict[str, bytes] = {}  # word -> its ids, native int32
        self._held = 0  # ids held in all (4 bytes each)
        self._lock = threading.Lock()  # around remembering (lookups take none)
        self.words = 0  # words looked up, and the distinct new ones among them that were encoded (approximate
        self.new = 0  # under threads: the tallies are not locked)
        # observe(words, new) after each call (Ivy's metrics: ivy_tokenizer_words_total, ..._new_words_total)
        self.observe: Callable[[int, int], None] | None = None

    def __len__(self) -> int:
        return len(self._ids)

    def ids_of(self, texts: Sequence[str], normalize: Callable[[str], str | None]) -> list[np.ndarray | None]:
        """Each text's content ids, None for a text `normalize` refuses or for all of them when the call is mostly
        new words (content_ids): the caller encodes those by its plain path."""
        normal = [normalize(t) for t in texts]
        mine = [n for n in normal if n is not None]
        found = self.content_ids(mine) if mine else []
        if found is None:
            return [None] * len(normal)
        ids = iter(found)
        return [None if n is None else next(ids) for n in normal]

    def content_ids(self, normalized: Sequence[str], max_new: int | None = None,
                    max_new_chars: int | None = None) -> list[np.ndarray] | None:
        """The content ids (no special tokens; int32 arrays) of texts already normalized (rose.ascii_bert,
        rose.ascii_bpe); None when more than LEARN_PER_CALL of the call's words, and more than half, are new (the
        caller encodes it by the plain path: cheaper than learning them all), or when more than `max_new` are new
        or they have more than `max_new_chars` characters in all (then none is learned or counted: a caller that
        may not wait long, an event loop, hands the call on)."""
        words = [self._split(t) for t in normalized]
        try:
            ids = self._lookup(words)
        except KeyError:
            pass
        else:
            self._count(sum(map(len, words)), 0)
            return ids
        distinct = dict.fromkeys(chain.from_iterable(words))  # in order of first appearance
        cache = self._ids
        new = [w for w in distinct if w not in cache]
        if (max_new is not None and len(new) > max_new) or (
                max_new_chars is not None and sum(map(len, new)) > max_new_chars):
            return None
        if len(new) > LEARN_PER_CALL and 2 * len(new) > len(distinct):
            learn = new[:LEARN_PER_CALL]  # the first to appear: a text's common words come early
            self._count(sum(map(len, words)), len(learn))
            self._remember(dict(zip(learn, map(_packed, self._encode_words(learn)))))
            return None
        # Some words are new: encode them in one call, remember them, and look up again.
        fresh = dict(zip(new, map(_packed, self._encode_words(new)))) if new else {}
        self._count(sum(map(len, words)), len(new))
        if self._remember(fresh):
            try:
                return self._lookup(words)
            except KeyError:  # the cache started again (_remember): its words known before are in `cache`
                pass
        # `cache` is the dict this call began with: a cache that starts again takes a new one and never empties it
        known = cache.__getitem__
        found = {w: fresh[w] if w in fresh else known(w) for w in distinct}
        get = found.__getitem__
        return [_as_array(b"".join(map(get, w))) for w in words]

    def _count(self, words: int, new: int) -> None:
        self.words += words
        self.new += new
        if self.observe is not None:
            self.observe(words, new)

    def _lookup(self, words: list[list[str]]) -> list[np.ndarray]:
        """Each text's ids from the cache alone (KeyError at its first unknown word)."""
        get = self._ids.__getitem__
        return [_as_array(b"".join(map(get, w))) for w in words]

    def _remember(self, fresh: dict[str, bytes]) -> bool:
        """Keep the words of `fresh` short enough to remember (at most `capacity` of them); start again empty when
        they would not fit. True when every one of them was kept."""
        keep = [(w, ids) for w, ids in fresh.items() if len(w) <= MAX_WORD_CHARS][: self.capacity]
        if keep:
            with self._lock:
                known = self._ids
                added = [(w, ids) for w, ids in keep if w not in known]  # another thread may have learned some
                if len(known) + len(added) > self.capacity or self._held + _count_ids(added) > self.max_ids:
                    # a new dict, not this one cleared: a call under way (this one too) still finds in it the words
                    # it knew when it began, instead of encoding them again (on the event loop: encode_warm)
                    self._ids = known = {}
                    self._held = 0
                    added = keep
                known.update(added)
                self._held += _count_ids(added)
        return len(keep) == len(fresh)


def _count_ids(words: list[tuple[str, bytes]]) -> int:
    return sum(len(ids) for _, ids in words) // 4
