"""The model folder's tokenizer (torch-free: the gateway tokenizes, replicas only check the fingerprint).

tokenizer.json through Hugging Face `tokenizers`, or a SentencePiece `.model` through `sentencepiece`
(XLM-R style folders without tokenizer.json, with fairseq's id offset). Truncation keeps the special
tokens: the content is cut to max_length minus the specials, then the post-processor adds them. Pairs
(cross-encoders) are cut longest first, as HF tokenizers' truncation="longest_first" cuts them.
tokenizer_config.json's add_bos_token / add_eos_token add the BOS / EOS that tokenizer.json's
post-processor leaves out, and sentence_bert_config.json's do_lower_case lowercases first (rose.tokenizer_configs).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from rose.ascii_bert import AsciiBert
from rose.ascii_bpe import AsciiByteLevel
from rose.encoded import Encoded, EncodedPair, longest_first
from rose.spec import ModelFolderError, ModelSpec, load_spec
from rose.spm_tokenizer import SentencePieceTokenizer
from rose.tokenizer_configs import config_specials, lowercase_first
from rose.word_cache import DEFAULT_CAPACITY, WARM_NEW_CHARS, WARM_NEW_WORDS

__all__ = ["Encoded", "EncodedPair", "Tokenizer", "longest_first"]

_SPM_NAMES = ("sentencepiece.bpe.model", "spiece.model", "tokenizer.model")
BPE_WHOLE_CHARS = 32768  # Tokenizer.takes_whole: a byte-level BPE's cached ASCII text up to this long is not cut
# The word cache takes a call of at most this many characters (Tokenizer.cache_call_chars): its lookups are Python
# and hold the GIL, ~3 ms for a 100-document request on the H200 host, while `tokenizers` releases it.
CACHE_CALL_CHARS = 32768


class Tokenizer:
    """Batch encode with per-call truncation; thread-safe (no per-call state on the shared tokenizer)."""

    def __init__(self, spec: ModelSpec, cache_words: int = DEFAULT_CAPACITY,
                 bpe_whole_chars: int = BPE_WHOLE_CHARS, cache_call_chars: int = CACHE_CALL_CHARS) -> None:
        """cache_words: how many words' ids a BERT or Qwen3-style BPE tokenizer may remember for ASCII text
        (rose.word_cache, rose.ascii_bpe; 0: none). bpe_whole_chars: see takes_whole. cache_call_chars: the
        cache takes a call whose texts have at most this many characters in all; a larger one (a bulk request)
        goes to `tokenizers`, whose Rust threads release the GIL, so it does not stall the caller's other
        threads (a gateway worker's event loop) for milliseconds; 0 = any call."""
        self.spec = spec
        self.bpe_whole_chars = bpe_whole_chars
        self.cache_call_chars = cache_call_chars
        self.max_length = spec.max_length
        tok_json = spec.model_dir / "tokenizer.json"
        if tok_json.is_file():
            from tokenizers import Tokenizer as HFTokenizer

            self._hf = HFTokenizer.from_file(str(tok_json))
            self._hf.no_truncation()
            self._hf.no_padding()
            config_path = spec.model_dir / "tokenizer_config.json"
            changed = config_specials(self._hf, config_path)
            # Without character offsets (nothing here reads them): 150 vs 191 us for 128 BERT tokens.
            self._encode_many = getattr(self._hf, "encode_batch_fast", self._hf.encode_batch)
            # BERT's normalizer in Python on ASCII text (rose/ascii_bert.py), its words' ids remembered; or a
            # Qwen3-style byte-level BPE's pieces' ids remembered (rose/ascii_bpe.py)
            self._ascii = AsciiBert.of(self._hf, cache_words)  # before the Lowercase below: BertNormalizer alone
            lowered = spec.lowercase and lowercase_first(self._hf)
            if lowered and self._ascii is not None:
                self._ascii.lowercase = True  # on ASCII, Lowercase then BertNormalizer is BertNormalizer lowercasing
            self._cached = self._ascii if self._ascii is not None and self._ascii.words is not None else \
                AsciiByteLevel.of(self._hf, cache_words)
            self._spm = None
            self._files = [tok_json, config_path] if changed else [tok_json]
            if lowered:
                self._files.append(spec.model_dir / "sentence_bert_config.json")
            self.num_special = self._hf.num_special_tokens_to_add(False)
            self.vocab_size = self._hf.get_vocab_size(with_added_tokens=True)
            self._wrap = self._fixed_wrap()
            # the same as int32 arrays, for content ids that are arrays (encode_batch's arrays=True)
            self._wrap_arrays = tuple(map(_int32, self._wrap)) if self._wrap is not None else None
        else:
            spm_file = next((spec.model_dir / n for n in _SPM_NAMES if (spec.model_dir / n).is_file()), None)
            if spm_file is None:
                raise ModelFolderError(
                    f"{spec.model_dir}: no tokenizer.json and no SentencePiece model ({', '.join(_SPM_NAMES)})")
            self._hf = None
            self._ascii = self._cached = None
            self._spm = SentencePieceTokenizer(spm_file, fairseq=spec.family in ("xlm-roberta", "roberta"),
                                               lowercase=spec.lowercase)
            self._wrap = self._wrap_arrays = None
            self._files = [spm_file]
            self.num_special = len(self._spm.head) + len(self._spm.tail)
            self.vocab_size = self._spm.vocab_size
        digest = hashlib.sha256()
        for path in self._files:
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
        self.fingerprint = digest.hexdigest()

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> Tokenizer:
        return cls(load_spec(model_dir))

    @property
    def hf(self):
        """The `tokenizers.Tokenizer` behind this one, or None for a SentencePiece model."""
        return self._hf

    def encode_batch(self, texts: Sequence[str], max_length: int | None = None, side: str = "right", *,
                     arrays: bool = False, rest: Callable[[list[str]], list] | None = None) -> list[Encoded]:
        """Tokenize with the model's special tokens; cut to `max_length` (default: the model's) from `side`.
        arrays: each Encoded's ids an int32 numpy array, not a list (what goes to the wire: the word cache's ids
        then never become Python ints; ivy.tokenization asks for them). rest: see content_ids."""
        if self._spm is not None:
            keep = max((self.max_length if max_length is None else max_length) - self.num_special, 1)
            out = [self._spm.encode(t, keep, side) for t in texts]
        elif self._wrap is not None:
            content = self.content_ids(texts, arrays=arrays, rest=rest)
            return [self._finish_ids(ids, max_length, side) for ids in content]
        else:
            out = [self.finish(enc, max_length, side) for enc in self.content_encodings(texts)]
        return [as_arrays(e) for e in out] if arrays else out

    def encode_warm(self, texts: Sequence[str], max_length: int | None = None, side: str = "right", *,
                    max_new: int = WARM_NEW_WORDS, max_new_chars: int = WARM_NEW_CHARS) -> list[Encoded] | None:
        """encode_batch(texts, max_length, side, arrays=True) where the word cache takes every text whole and at
        most `max_new` of the call's words are new, with `max_new_chars` characters in all (learned here), else
        None, having learned nothing (encode_batch then does it all). Warm, all of this holds the GIL (~0.1 µs a
        character in C string passes and dict lookups), so a thread would free no one and its two hand-offs would
        only add to it: a caller on an event loop does it there (ivy.tokenization). Bounded: the call's characters
        by cache_call_chars (its default when that is 0, "any call"), a BPE text's by bpe_whole_chars, and the
        new words' by those two caps (one `tokenizers` call on at most `max_new_chars` characters)."""
        cached = self._cached
        if cached is None or self._wrap is None or sum(map(len, texts)) > self.warm_chars:
            return None
        if any(map(self._bpe_cut, texts)):
            return None  # cut in pieces instead (takes_whole)
        normal = [cached.normalized(t) for t in texts]
        if any(n is None for n in normal):
            return None  # one text for the plain path: the whole call goes with it, nothing looked up
        ids = cached.words.content_ids(normal, max_new, max_new_chars)
        if ids is None:
            return None
        return [self._finish_ids(x, max_length, side) for x in ids]

    def content_ids(self, texts: Sequence[str], *, arrays: bool = False,
                    rest: Callable[[list[str]], list] | None = None) -> list[list[int]] | list[np.ndarray]:
        """Content ids without special tokens (HF tokenizers only): through the word cache where it takes a text
        (rose.word_cache), the others in one content_encodings call, or by `rest` (texts -> their content ids: how
        ivy.split_encode cuts a long one in pieces). arrays: int32 numpy arrays, not lists."""
        texts = list(texts)
        convert = _int32 if arrays else _ints
        if self._cached is None:
            return [convert(e.ids) for e in self.content_encodings(texts)]
        if not self._cache_takes(sum(map(len, texts))):  # all in `tokenizers`, its normalizer too: no GIL held
            if rest is not None:  # the caller's way (long texts in pieces)
                return [convert(x) for x in rest(texts)]
            return [convert(e.ids) for e in self._encode_many(texts, add_special_tokens=False)]
        ids = self._cached.words.ids_of(texts, self._cached.normalized)
        left = [i for i, x in enumerate(ids) if x is None]
        if left:
            encode = rest or (lambda some: [enc.ids for enc in self.content_encodings(some)])
            for i, found in zip(left, encode([texts[i] for i in left])):
                ids[i] = found
        return [convert(x) for x in ids]

    @property
    def word_cache(self):
        """The rose.word_cache.WordCache behind ASCII texts, or None (neither a BERT nor a Qwen3-style tokenizer,
        or turned off)."""
        return self._cached.words if self._cached is not None else None

    def takes_whole(self, text: str) -> bool:
        """Whether encode_batch is fastest on `text` whole, never in pieces (ivy.split_encode): a text BERT's word
        cache takes (ASCII, no added token's text), whose new words are encoded in one batch call anyway; warm,
        4096 tokens took 0.79 ms on the H200 host where 8 pieces in parallel took 1.5. A byte-level BPE's up to
        bpe_whole_chars: whole through its chunks (rose.ascii_bpe), a 4096-token text's tokenizing took 1.6 ms
        through the stack on the H200 host against 2.6 in pieces (11c8496; benchmarks/NOTES.md, "The byte-level
        BPE's cache by chunks")."""
        if self._cached is None or self._wrap is None or self._bpe_cut(text):
            return False  # no cache, or one encode_batch does not read (a post-processor that is not a fixed wrap)
        return self._cache_takes(len(text)) and self._cached.normalized(text) is not None

    @property
    def warm_chars(self) -> int:
        """The most characters a call of encode_warm takes (cache_call_chars, or its default where that is 0)."""
        return self.cache_call_chars or CACHE_CALL_CHARS

    def _bpe_cut(self, text: str) -> bool:
        """A byte-level BPE's text too long to go whole through its cache (bpe_whole_chars): cut in pieces."""
        return self._cached is not self._ascii and len(text) > self.bpe_whole_chars

    def _cache_takes(self, chars: int) -> bool:
        """Whether a call of `chars` characters in all may go through the word cache (cache_call_chars)."""
        return not self.cache_call_chars or chars <= self.cache_call_chars

    # The three steps of encode_batch (HF tokenizers only), for callers that encode a long text in pieces
    # (ivy.split_encode): content without specials, pieces merged, then truncated and wrapped as one.

    def content_encodings(self, texts: Sequence[str]) -> list:
        """`tokenizers` Encodings without special tokens, through the fast path (no offsets)."""
        if self._ascii is not None:
            return self._ascii.encode_many(self._encode_many, list(texts), add_special_tokens=False)
        return self._encode_many(list(texts), add_special_tokens=False)

    @staticmethod
    def merge(encodings: list):
        from tokenizers import Encoding

        return encodings[0] if len(encodings) == 1 else Encoding.merge(encodings, growing_offsets=True)

    def finish(self, enc, max_length: int | None = None, side: str = "right") -> Encoded:
        """Content cut to max_length minus the specials from `side`, then the post-processor's specials."""
        if self._wrap is not None:  # the post-processor's ids without it (0.1 vs 0.4 ms at 4096 tokens)
            return self._finish_ids(enc.ids, max_length, side)
        keep = max((self.max_length if max_length is None else max_length) - self.num_special, 1)
        n = len(enc.ids)
        if n > keep:
            enc.truncate(keep, direction=side)
        full = self._hf.post_process(enc, None, True)
        return Encoded(ids=list(full.ids), original_length=n + self.num_special, truncated=n > keep)

    def _finish_ids(self, ids, max_length: int | None, side: str) -> Encoded:
        """finish() for content ids (a list, or an int32 array: then the ids are one too), with the
        post-processor's fixed (prefix, suffix)."""
        keep = max((self.max_length if max_length is None else max_length) - self.num_special, 1)
        n = len(ids)
        if n > keep:
            ids = ids[:keep] if side == "right" else ids[n - keep:]
        if isinstance(ids, np.ndarray):
            head, tail = self._wrap_arrays
            full = np.concatenate((head, ids, tail))
        else:
            head, tail = self._wrap
            full = [*head, *ids, *tail]
        return Encoded(ids=full, original_length=n + self.num_special, truncated=n > keep)

    def _fixed_wrap(self) -> tuple[list[int], list[int]] | None:
        """(prefix, suffix) when the post-processor puts the same ids around any content (seen on probes; true
        of Bert, Roberta, ByteLevel and Template processors), else None: finish() then calls it."""
        probes = self._encode_many(["", "hello world", "Ünïcødé 東京 🚀, a b c d e f g h"], add_special_tokens=False)
        outs = [self._hf.post_process(p, None, True).ids for p in probes]
        empty = outs[0]
        if len(empty) != self.num_special:
            return None
        for k in range(len(empty) + 1):
            if all(o == [*empty[:k], *p.ids, *empty[k:]] for p, o in zip(probes, outs)):
                return empty[:k], empty[k:]
        return None

    def encode_pairs(self, pairs: Sequence[tuple[str, str]], max_length: int | None = None,
                     side: str = "right") -> list[EncodedPair]:
        """Each (text, text_pair) as one sequence with the model's pair specials ([CLS] a [SEP] b [SEP] with
        types 0 then 1; XLM-R <s> a </s></s> b </s>), cut longest first to `max_length` (default: the model's)."""
        limit = self.max_length if max_length is None else max_length
        if self._spm is not None:
            return [self._spm.encode_pair(a, b, limit, side) for a, b in pairs]
        firsts = self.content_encodings([a for a, _ in pairs])
        seconds = self.content_encodings([b for _, b in pairs])
        specials = self._hf.num_special_tokens_to_add(True)
        out = []
        for a, b in zip(firsts, seconds):
            n1, n2 = len(a.ids), len(b.ids)
            k1, k2 = longest_first(n1, n2, max(limit - specials, 0))
            for enc, n, k in ((a, n1, k1), (b, n2, k2)):
                if k < n:
                    enc.truncate(k, direction=side)
            full = self._hf.post_process(a, b, True)
            out.append(EncodedPair(list(full.ids), list(full.type_ids), n1 + n2 + specials, (k1, k2) != (n1, n2)))
        return out

    def encode(self, text: str, max_length: int | None = None, side: str = "right") -> Encoded:
        return self.encode_batch([text], max_length, side)[0]

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        if self._spm is not None:
            return [len(self._spm.piece_ids(t)) + self.num_special for t in texts]
        return [len(ids) + self.num_special for ids in self.content_ids(texts)]

    def encodings_with_offsets(self, texts: Sequence[str], add_special_tokens: bool = True) -> list | None:
        """`tokenizers` Encodings of `texts` with their character offsets, tokens and special-token masks, never
        truncated (POST /tokenize's text-embeddings-inference body); None for a SentencePiece model. Off the
        embedding path, which skips offsets (encode_batch_fast) and goes through the word cache: the same ids."""
        if self._hf is None:
            return None
        return self._hf.encode_batch(list(texts), add_special_tokens=add_special_tokens)

    def id_to_tokens(self, ids: Sequence[int]) -> list[str]:
        """Each id's token as the vocabulary writes it ("##ing", "Ġthe", "[CLS]"): transformers'
        convert_ids_to_tokens (ids in 0..vocab_size - 1; the caller's own)."""
        if self._spm is not None:
            return [self._spm.token(int(i)) for i in ids]
        token = self._hf.id_to_token
        return [token(int(i)) for i in ids]

    def token_id(self, token: str) -> int | None:
        if self._spm is not None:
            return self._spm.token_id(token)
        return self._hf.token_to_id(token)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """The text of token ids (ids in 0..vocab_size - 1; the caller checks), as the tokenizer's decoder
        writes it; special tokens left out unless `skip_special_tokens` is false."""
        if self._spm is not None:
            return self._spm.decode(ids, skip_special_tokens)
        return self._hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def decode_batch(self, seqs: Sequence[Sequence[int]], skip_special_tokens: bool = True) -> list[str]:
        """decode() of each id list; a tokenizer.json's in one call that releases the GIL."""
        if self._spm is not None:
            return [self._spm.decode(ids, skip_special_tokens) for ids in seqs]
        return self._hf.decode_batch([list(ids) for ids in seqs], skip_special_tokens=skip_special_tokens)


def _int32(ids) -> np.ndarray:
    return np.asarray(ids, dtype=np.int32)


def _ints(ids) -> list[int]:
    return ids.tolist() if isinstance(ids, np.ndarray) else list(ids)


def as_arrays(enc: Encoded) -> Encoded:
    """`enc` with its ids an int32 array (Tokenizer.encode_batch's arrays=True)."""
    return enc if isinstance(enc.ids, np.ndarray) else Encoded(_int32(enc.ids), enc.original_length, enc.truncated)
