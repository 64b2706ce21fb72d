"""Token ids and texts apart from the embedding path, on the worker's tokenizer threads (InputEncoder.run): POST
/tokenize (vLLM's ids and token strings, text-embeddings-inference's tokens with their offsets), /decode and
/detokenize, and texts cut to their first k tokens (Cohere v2's rerank `max_tokens_per_doc`). /tokenize takes at most
64 times the per-input character cap (`cap`) and /decode as many ids; a text to cut is first cut to the cap itself."""

from __future__ import annotations

from collections.abc import Sequence

from ivy import offsets
from ivy.errors import IvyError, Problem
from ivy.tokenization import InputEncoder, check_vocab, text_size


class TokenTexts:
    def __init__(self, encoder: InputEncoder) -> None:
        self.encoder = encoder
        self.tokenizer = encoder.tokenizer
        self.cap = 64 * encoder.char_cap  # /tokenize's (and /decode's) characters a request: see tokenize

    async def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Every token of `text`, never truncated (POST /tokenize: counting before chunking a document), up
        to 64 times the per-input character cap (MiniLM: 262144 characters): a document beyond that is split
        before anyway, and a bigger one would hold a tokenizer thread for seconds."""
        self._tokenize_cap(text, "prompt")
        return await self.encoder.run(self._tokenize, text, add_special_tokens, size=len(text))

    def _tokenize_cap(self, text: str, name: str) -> None:
        cap = self.cap
        if len(text) > cap:
            raise IvyError(Problem.INPUT_TOO_LONG, f"{name} has {len(text)} characters; /tokenize takes at most "
                           f"{cap}", param=name, limit=cap)

    def check_cut(self, param: str) -> None:
        """cut_to_tokens reads `tokenizers`' offsets: a 400 naming `param` for a SentencePiece model without
        tokenizer.json, before any work."""
        if self.tokenizer.hf is None:
            raise IvyError(Problem.UNSUPPORTED_TASK, f"{param}: this model's tokenizer is a SentencePiece model "
                           "without tokenizer.json, whose token offsets Ivy does not read; send truncate or "
                           "truncate_prompt_tokens instead", param=param)

    async def cut_to_tokens(self, texts: Sequence[str], k: int, side: str, param: str) -> list[str]:
        """Each text cut to its first k tokens (its last k with side "left"), special tokens not counted, as text:
        the span its k tokens cover (Cohere v2's rerank `max_tokens_per_doc`, which cuts every document rather
        than refusing it). A text over the per-input character cap is cut to the cap first, as truncate=true
        cuts it, so that no text costs more than the cap to tokenize here. Callers check_cut first."""
        cap = self.encoder.char_cap
        capped = [t if len(t) <= cap else (t[:cap] if side == "right" else t[-cap:]) for t in texts]
        size = text_size(capped, self.encoder.inline_chars)
        return await self.encoder.run(self._cut_to_tokens, capped, k, side, size=size)

    def _cut_to_tokens(self, texts: list[str], k: int, side: str) -> list[str]:
        return offsets.cut_to_tokens(self.tokenizer.encodings_with_offsets(texts, add_special_tokens=False), texts,
                                     k, side)

    async def token_strs(self, ids: Sequence[int]) -> list[str]:
        """Each id's token as the vocabulary writes it (vLLM's /tokenize return_token_strs: transformers'
        convert_ids_to_tokens)."""
        return await self.encoder.run(self.tokenizer.id_to_tokens, ids, size=len(ids))

    async def tokenize_spans(self, texts: Sequence[str], add_special_tokens: bool, prompt: str,
                             names: Sequence[str]) -> bytes:
        """POST /tokenize's text-embeddings-inference answer: per text (`prompt` before it, as TEI prepends its
        prompt_name's), each token as {"id", "text", "special", "start", "stop"}, never truncated, each text up
        to /tokenize's cap (names[i]: texts[i]'s field, for errors). As TEI's into_tokens: a special token's
        text is its vocabulary string and start / stop null; another's text is the span of the (prompted) text
        it covers, start / stop its UTF-8 byte offsets there (Rust `tokenizers`' offsets; Python's are characters).
        The answer's JSON bytes, made on the tokenizer thread (ivy.offsets.simple_tokens_json). All the texts
        together (their prompts included) take /tokenize's cap for one text: ~67 bytes are answered for a
        one-character token, and 2 MB of such texts were a 141 MB answer."""
        for text, name in zip(texts, names):
            self._tokenize_cap(text, name)
        total, cap = sum(map(len, texts)) + len(prompt) * len(texts), self.cap
        if total > cap:
            raise IvyError(Problem.INPUT_TOO_LONG, f"inputs hold {total} characters in all (prompts included); "
                           f"/tokenize takes at most {cap} a request", param="inputs", limit=cap)
        if self.tokenizer.hf is None:
            raise IvyError(Problem.UNSUPPORTED_TASK, "this model's tokenizer is a SentencePiece model without "
                           "tokenizer.json: /tokenize answers text-embeddings-inference's `inputs` body with "
                           "offsets from `tokenizers` only; send vLLM's `prompt` body", param=names[0])
        size = text_size(texts, self.encoder.inline_chars, extra=len(prompt))
        return await self.encoder.run(self._tokenize_spans, texts, add_special_tokens, prompt, size=size)

    def _tokenize_spans(self, texts: Sequence[str], add_special_tokens: bool, prompt: str) -> bytes:
        full = [prompt + text for text in texts] if prompt else list(texts)
        encodings = self.tokenizer.encodings_with_offsets(full, add_special_tokens)
        return b"[" + b",".join(offsets.simple_tokens_json(enc, text) for enc, text in zip(encodings, full)) + b"]"

    async def decode(self, seqs: list[list[int]], skip_special_tokens: bool, names: Sequence[str]) -> list[str]:
        """The text of each id list (POST /decode, /detokenize); names[i] is seqs[i]'s field, for errors: at most
        64 times the per-input character cap ids each (what /tokenize takes in characters, so its ids come back),
        every id in the vocabulary (a 422 naming `names[i][j]`)."""
        size = text_size(seqs, self.encoder.inline_chars)
        return await self.encoder.run(self._decode, seqs, skip_special_tokens, names, size=size)

    def _decode(self, seqs: list[list[int]], skip_special_tokens: bool, names: Sequence[str]) -> list[str]:
        vocab, cap = self.encoder.vocab_limit, self.cap  # /tokenize's own cap, in characters
        for seq, name in zip(seqs, names):
            if len(seq) > cap:
                raise IvyError(Problem.INPUT_TOO_LONG, f"{name} has {len(seq)} ids; at most {cap} are decoded (the "
                               "characters /tokenize takes)", param=name, limit=cap)
            check_vocab(seq, name, vocab)
        return self.tokenizer.decode_batch(seqs, skip_special_tokens)

    def _tokenize(self, text: str, add_special_tokens: bool) -> list[int]:
        if add_special_tokens:
            return self.encoder.splitter.encode_batch([text], 1 << 30)[0].ids
        return self.encoder.content_ids([text])[0]
