"""Templating, the character cap, tokenization and truncation, off the event loop.

One `InputEncoder` per worker owns a small thread pool; each request's whole batch is one job there
(HF `tokenizers` releases the GIL in encode_batch), so the event loop only parses JSON and moves bytes.
Small texts (at most `inline_chars` characters in the whole request) are encoded on the loop instead, and
token ids are always checked there (the check holds the GIL: a thread would not free the loop): the hop to the pool and back (two thread wake-ups, a self-pipe write) cost more than
tokenizing a short query (~0.1 ms on this project's CPU; far more on a host where syscalls are slow),
and the loop is held for at most that long. See benchmarks/OVERHEAD_NOTES.md. Larger texts that the tokenizer's
word cache takes whole and knows nearly every word of are encoded on the loop too (`warm_inline`): that work holds
the GIL in a thread just as long, so the pool would only add its hand-offs (benchmarks/NOTES.md, "Tokenization").
A text over `split_chars` characters is cut at boundaries the tokenizer splits at anyway and its pieces
encoded on several of the pool's threads (ivy.split_encode), with the plain encode's ids.
Token counts returned here are the ones sent to Tulip, so `usage` is exact. Errors name the input index
and the limit and never quote the text.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from ivy.errors import IvyError, Problem
from ivy.pairs import PairEncoder, Pairs
from ivy.split_encode import SplitEncoder
from rose.spec import ModelSpec, config_vocab_size
from rose.tokenizer import Tokenizer

# The request's monotonic deadline, set by Gateway.read_request in the request's task (its gather()s inherit it):
# work waiting for the tokenizer threads is given up at it (a 504), so a request is never answered late because
# others' long texts held the threads (RELIABILITY 14).
request_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar("ivy_request_deadline", default=None)

T = TypeVar("T")

_QUERY_TYPES = {"query": "query", "search_query": "query", "document": "document",
                "search_document": "document", "passage": "document"}


@dataclass(frozen=True)
class Documents:
    """Late-chunking input: one sequence per document and, per document, each chunk's (start, end)."""

    sequences: list[list[int]]
    spans: list[list[tuple[int, int]]]


CUT_HINT = "send truncate=true to cut it"  # an over-long text's 422 (a route with other names rewrites it)


def too_long(param: str, n: int, limit: int, hint: str = CUT_HINT) -> IvyError:
    return IvyError(Problem.INPUT_TOO_LONG, f"{param} has {n} tokens; the model takes at most {limit} ({hint})",
                    param=param, limit=limit)


def check_vocab(seq: Sequence[int], where: str, vocab: int) -> np.ndarray:
    """`seq` as int32 ids (what the wire carries: ivy.encode.embed_request packs such arrays without reading
    Python ints a second time), or a 422 naming `where[j]` for its first id outside 0..vocab - 1."""
    try:
        arr = np.asarray(seq, dtype=np.int64)
        bad = np.flatnonzero((arr < 0) | (arr >= vocab))
        j = int(bad[0]) if bad.size else -1
    except OverflowError:  # beyond int64: find it the slow way
        j = next(k for k, t in enumerate(seq) if not 0 <= t < vocab)
    if j >= 0:
        raise IvyError(Problem.INVALID_PARAMETER, f"{where}[{j}] is token id {seq[j]}, outside the model's "
                       f"vocabulary (0..{vocab - 1})", param=f"{where}[{j}]", limit=vocab - 1)
    return arr.astype(np.int32)  # every id is in 0..vocab - 1, so it fits


def _where(param: str | tuple[str, ...], one: bool, i: int) -> str:
    """How an error names the request's i-th text (`one`: the field is a single text, not a list); a tuple names
    each text itself (/predict's texts, picked out of a batch that mixes them with pairs)."""
    if isinstance(param, tuple):
        return param[i]
    return param if one else f"{param}[{i}]"


def text_size(items, limit: int, extra: int = 0) -> int:
    """Total length of `items` (each plus `extra`), counting only until it passes `limit`."""
    total = 0
    for item in items:
        total += len(item) + extra
        if total > limit:
            break
    return total


class InputEncoder:
    def __init__(self, spec: ModelSpec, tokenizer: Tokenizer, *, threads: int, char_cap: int,
                 query_prefix: str = "", document_prefix: str = "",
                 observe: Callable[[float], None] | None = None, inline_chars: int = 0,
                 split_chars: int = 1000, piece_chars: int = 500, warm_inline: bool = True) -> None:
        self.spec = spec
        self.tokenizer = tokenizer
        self.max_length = spec.max_length
        self.char_cap = char_cap
        self._prefixes = {"query": query_prefix, "document": document_prefix}
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ivy-tokenize")
        self._observe = observe
        self.inline_chars = inline_chars
        self.warm_inline = warm_inline  # larger texts the word cache knows: tokenized on the loop (_encode_warm)
        self.splitter = SplitEncoder(tokenizer, self._pool, threads, split_chars=split_chars,
                                     piece_chars=piece_chars)
        self._prefix_ids, self._suffix_ids = self._special_layout()
        # Ids the model can embed: below both the tokenizer's size and the embedding table's (Tulip checks
        # config.json's vocab_size; Qwen3's table is larger than its tokenizer, some tokenizers add tokens
        # past the table), so a request Ivy accepts is never refused by a replica for its ids.
        table = config_vocab_size(spec.config)
        self.vocab_limit = min(tokenizer.vocab_size, table) if table else tokenizer.vocab_size
        sep = spec.chunk_separator
        self._separator_ids = self.content_ids([sep])[0] if sep else []
        self.pairs = PairEncoder(spec, tokenizer, char_cap) if spec.score_head is not None else None

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def run(self, fn: Callable[..., T], *args, size: int | None = None,
                   first: Callable[..., T | None] | None = None) -> T:
        """fn(*args) in the pool, or on the loop when `size` (characters or ids) is at most inline_chars; `first`,
        tried on the loop before the pool, answers instead when it returns anything but None."""
        start = time.perf_counter()
        try:
            if size is not None and size <= self.inline_chars:
                return fn(*args)
            if first is not None and (done := first(*args)) is not None:
                return done
            job = asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)
            deadline = request_deadline.get()
            if deadline is None:
                return await job
            try:  # on timeout the job is cancelled: one still queued never runs
                return await asyncio.wait_for(job, max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                raise IvyError(Problem.DEADLINE_EXCEEDED, "the request did not finish within its deadline (its "
                               "texts waited for the tokenizer threads)") from None
        finally:
            if self._observe is not None:
                self._observe(time.perf_counter() - start)

    # ---- templating ----

    def prompt_for(self, input_type: str | None, prompt_name: str | None, param: str = "prompt_name") -> str:
        """The text prepended to every input: a named prompt, a query/document prompt, or the model default.
        param: where the request put prompt_name (errors name it)."""
        prompts = self.spec.prompts
        if prompt_name is not None:
            if prompt_name not in prompts:
                known = ", ".join(sorted(prompts)) or "none"
                raise IvyError(Problem.INVALID_PARAMETER, f"{param} is not one of the model's prompts ({known})",
                               param=param)
            return prompts[prompt_name]
        if input_type is not None:
            kind = _QUERY_TYPES[input_type]
            names = ("query",) if kind == "query" else ("document", "passage")
            for name in names:
                if name in prompts:
                    return prompts[name]
            return self._prefixes[kind]
        if self.spec.default_prompt_name and self.spec.default_prompt_name in prompts:
            return prompts[self.spec.default_prompt_name]
        return ""

    # ---- texts ----

    async def encode_texts(self, texts: Sequence[str], *, truncate: bool, side: str, prompt: str = "",
                           param: str = "input", one: bool = False,
                           max_tokens: int | None = None) -> list[np.ndarray]:
        """Each text's ids as an int32 array (what ivy.encode.packed_ids sends as it is, as for checked ids).
        one: `param` is a single text sent as itself, not a list (errors name it without an index).
        max_tokens: cut to this many tokens, the special tokens included (vLLM's truncate_prompt_tokens), not the
        model's max_length; only with truncate."""
        size = text_size(texts, self.inline_chars, extra=len(prompt))
        return await self.run(self._encode_texts, texts, truncate, side, prompt, param, one, max_tokens, size=size,
                               first=self._encode_warm if self.warm_inline else None)

    def _encode_texts(self, texts: Sequence[str], truncate: bool, side: str, prompt: str,
                      param: str, one: bool = False, max_tokens: int | None = None) -> list[np.ndarray]:
        capped = self._capped(texts, truncate, side, prompt, param, one)
        encoded = self.splitter.encode_batch(capped, max_tokens or self.max_length, side, arrays=True)
        return self._checked(encoded, truncate, param, one)

    def _encode_warm(self, texts: Sequence[str], truncate: bool, side: str, prompt: str,
                     param: str, one: bool = False, max_tokens: int | None = None) -> list[np.ndarray] | None:
        """_encode_texts where the word cache takes the texts whole and knows nearly all their words
        (rose.tokenizer's encode_warm), else None. That work holds the GIL, so on the loop it costs what it would
        in a thread, less the two hand-offs (~0.3 ms for 4096 tokens on this project's CPU). A request over the
        warm path's characters is handed on before any text is copied (a bulk request's capping stays in the pool)."""
        bound = self.tokenizer.warm_chars
        if text_size(texts, bound, extra=len(prompt)) > bound:
            return None
        capped = self._capped(texts, truncate, side, prompt, param, one)
        encoded = self.tokenizer.encode_warm(capped, max_tokens or self.max_length, side)
        return None if encoded is None else self._checked(encoded, truncate, param, one)

    def _capped(self, texts: Sequence[str], truncate: bool, side: str, prompt: str, param: str,
                one: bool) -> list[str]:
        """The texts cut to the character cap (or a 422 naming the first over it), the prompt before each."""
        cap = self.char_cap
        capped = []
        for i, text in enumerate(texts):
            if len(text) > cap:
                if not truncate:
                    where = _where(param, one, i)
                    raise IvyError(Problem.INPUT_TOO_LONG, f"{where} has {len(text)} characters; the limit "
                                   f"is {cap} ({CUT_HINT})", param=where, limit=cap)
                text = text[:cap] if side == "right" else text[-cap:]
            capped.append(prompt + text if prompt else text)
        return capped

    def _checked(self, encoded: list, truncate: bool, param: str, one: bool) -> list[np.ndarray]:
        """Each encoding's ids, or a 422 naming the first one cut when the request did not allow cutting."""
        if not truncate:
            for i, enc in enumerate(encoded):
                if enc.truncated:
                    raise too_long(_where(param, one, i), enc.original_length, self.max_length)
        return [enc.ids for enc in encoded]

    # ---- (query, document) pairs of a cross-encoder ----

    async def encode_pairs(self, queries: Sequence[str], docs: Sequence[str], *, truncate: bool, side: str,
                           instruction: str | None, names: tuple, max_tokens: int | None = None) -> Pairs:
        """One sequence per pair (ivy.pairs); only for a cross-encoder or a classifier (self.pairs is set).
        max_tokens: what a pair is cut to with truncate (vLLM's truncate_prompt_tokens), not the model's length."""
        size = text_size(queries, self.inline_chars) + text_size(docs, self.inline_chars)
        return await self.run(self.pairs.encode, queries, docs, truncate, side, instruction, names, max_tokens,
                               size=size)

    # ---- token ids ----

    async def check_ids(self, seqs: list[list[int]], *, truncate: bool, side: str,
                        param: str = "input", flat: bool = False, max_tokens: int | None = None) -> list[np.ndarray]:
        # On the loop whatever the size: reading Python ints into an array holds the GIL, so a pool thread would
        # block the loop as long and add two thread hand-offs (benchmarks/NOTES.md, "Token ids in the gateway").
        return await self.run(self._check_ids, seqs, truncate, side, param, flat, max_tokens, size=0)

    def _check_ids(self, seqs: list[list[int]], truncate: bool, side: str, param: str,
                   flat: bool = False, max_tokens: int | None = None) -> list[np.ndarray]:
        """Each sequence checked (vocabulary, length) and returned as an int32 array, truncated if asked (to
        max_tokens when given, else the model's max_length).
        flat: `seqs` is the one list the client sent as `param` itself (errors name param[j], not param[0][j])."""
        vocab = self.vocab_limit
        limit = max_tokens or self.max_length
        out = []
        for i, seq in enumerate(seqs):
            where = param if flat else f"{param}[{i}]"
            seq = check_vocab(seq, where, vocab)
            if len(seq) > limit:
                if not truncate:
                    raise too_long(where, len(seq), limit)
                seq = seq[:limit] if side == "right" else seq[-limit:]
            out.append(seq)
        return out

    # ---- documents of chunks (late chunking) ----

    async def encode_documents(self, docs: list[list[str]]) -> Documents:
        size = text_size((chunk for doc in docs for chunk in doc), self.inline_chars)
        return await self.run(self._encode_documents, docs, size=size)

    def _encode_documents(self, docs: list[list[str]]) -> Documents:
        """Each document's chunks joined into one sequence (separator tokens between them, the model's
        special tokens around), each chunk's token span recorded for span pooling."""
        cap = self.char_cap
        for i, doc in enumerate(docs):
            chars = sum(map(len, doc))
            if chars > cap:
                raise IvyError(Problem.INPUT_TOO_LONG, f"input[{i}] has {chars} characters; the limit is {cap}",
                               param=f"input[{i}]", limit=cap)
        flat = [chunk for doc in docs for chunk in doc]
        pieces = iter(self.content_ids(flat))
        sequences, spans = [], []
        for i, doc in enumerate(docs):
            seq = list(self._prefix_ids)
            doc_spans = []
            for j in range(len(doc)):
                ids = next(pieces)
                if not ids:
                    raise IvyError(Problem.EMPTY_INPUT, f"input[{i}][{j}] has no tokens", param=f"input[{i}][{j}]")
                if j:
                    seq.extend(self._separator_ids)
                doc_spans.append((len(seq), len(seq) + len(ids)))
                seq.extend(ids)
            seq.extend(self._suffix_ids)
            if len(seq) > self.max_length:
                raise too_long(f"input[{i}]", len(seq), self.max_length,
                               "a document's chunks are never cut: split it into several documents")
            sequences.append(seq)
            spans.append(doc_spans)
        return Documents(sequences, spans)

    def content_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids without the special tokens the tokenizer's post-processor adds."""
        head, tail = len(self._prefix_ids), len(self._suffix_ids)
        huge = 1 << 30
        return [e.ids[head: len(e.ids) - tail] for e in self.splitter.encode_batch(list(texts), huge)]

    def _special_layout(self) -> tuple[list[int], list[int]]:
        """(prefix, suffix) special ids around content, read off an empty and a probe encoding."""
        empty = self.tokenizer.encode("", 1 << 30).ids
        probe = self.tokenizer.encode("hello world", 1 << 30).ids
        k = 0
        while k < len(empty) and k < len(probe) and probe[k] == empty[k]:
            k += 1
        prefix, suffix = empty[:k], empty[k:]
        if suffix and probe[len(probe) - len(suffix):] != suffix:
            suffix = []
        return list(prefix), list(suffix)
