"""A cross-encoder's input: each (query, document) pair as one token sequence (tokenization only, no I/O); a
classifier's pairs (/predict's [text, text_pair]) are encoded as the classifier rerankers' are.

- Classifier rerankers (BERT / XLM-R, rose.cross_spec): the tokenizer's pair encoding, [CLS] q [SEP] d [SEP]
  (XLM-R <s> q </s></s> d </s>), cut longest first to the model's length as sentence-transformers'
  CrossEncoder tokenizes; BERT's token types (0 for the query, 1 for the document) travel with the ids.
- Yes/no rerankers (Qwen3-Reranker): its model card's prompt around the pair, system prompt, then
  "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}", then the assistant suffix; only
  the middle is cut (from `side`), never the prompt, as the card's process_inputs does.
A length to cut to other than the model's (vLLM's truncate_prompt_tokens, ivy.cross_encode) bounds the whole
sequence, as vLLM's tokenizer call with max_length does: BERT's pair cut longest first, the prompt kept whole.
Errors name the field as the embedding models' path does (ivy.tokenization): a text sent as one string by its
field (`query`), a list's element with its index (`documents[3]`); a pair too long names its longer text (the
one cutting longest first shortens first); with the limit, and never quoting the text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ivy.errors import IvyError, Problem
from ivy.inputs import sent_as_one
from rose.spec import ModelFolderError, ModelSpec
from rose.tokenizer import Tokenizer

QWEN3_RERANK_PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    "provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n")
QWEN3_RERANK_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
QWEN3_RERANK_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"


@dataclass(frozen=True)
class Pairs:
    sequences: list[list[int]]
    token_types: list[list[int]] | None  # per sequence (BERT pairs), or None: type 0 everywhere


def too_long_pair(param: str, n: int, limit: int) -> IvyError:
    return IvyError(Problem.INPUT_TOO_LONG, f"the pair with {param} has {n} tokens; the model takes at most {limit} "
                    "(send truncate=true to cut it)", param=param, limit=limit)


def _where(name: str | tuple[str, ...], one: bool, i: int) -> str:
    """How an error names text i of a field; a tuple names each text itself (/predict's pairs, ivy.inputs)."""
    if isinstance(name, tuple):
        return name[i]
    return name if one else f"{name}[{i}]"


class PairEncoder:
    def __init__(self, spec: ModelSpec, tokenizer: Tokenizer, char_cap: int) -> None:
        self.spec, self.tokenizer, self.char_cap = spec, tokenizer, char_cap
        self.max_length = spec.max_length
        self.yes_no = spec.score_head.kind == "yes_no"
        self.types = spec.type_vocab_size > 1
        # `added`: the tokens a pair gets around its two texts (the yes/no prompt, or the pair's special tokens)
        if self.yes_no:
            if tokenizer.hf is None:
                raise ModelFolderError(f"{spec.model_dir}: a yes/no reranker needs tokenizer.json")
            prefix, suffix = tokenizer.content_encodings([QWEN3_RERANK_PREFIX, QWEN3_RERANK_SUFFIX])
            self.prefix, self.suffix = list(prefix.ids), list(suffix.ids)
            self.added = len(self.prefix) + len(self.suffix) + tokenizer.num_special
        else:
            self.added = len(tokenizer.encode_pairs([("", "")])[0].ids)  # [CLS] [SEP] [SEP]; XLM-R's four

    def encode(self, queries: Sequence[str], docs: Sequence[str], truncate: bool, side: str,
               instruction: str | None, names: tuple, max_length: int | None = None) -> Pairs:
        """queries[i] with docs[i], or one query with every document; `names` are the request's fields for
        them (or, each a tuple, every text's own name). max_length: the tokens a pair may have (vLLM's
        truncate_prompt_tokens), not the model's; with
        truncate only."""
        ones = sent_as_one(queries, single=True), sent_as_one(docs)  # before the lists are copied
        queries = self._capped(queries, truncate, side, names[0], ones[0])
        docs = self._capped(docs, truncate, side, names[1], ones[1])
        broadcast = len(queries) == 1
        if broadcast:
            queries = queries * len(docs)
        limit = max_length or self.max_length
        if self.yes_no:
            if instruction is not None and len(instruction) > self.char_cap:  # it is repeated in every pair
                raise IvyError(Problem.INPUT_TOO_LONG, f"instruction has {len(instruction)} characters; the limit "
                               f"is {self.char_cap}", param="instruction", limit=self.char_cap)
            fixed = len(self.prefix) + len(self.suffix)
            texts = [f"<Instruct>: {instruction or QWEN3_RERANK_INSTRUCTION}\n<Query>: {q}\n<Document>: {d}"
                     for q, d in zip(queries, docs)]
            encoded = self.tokenizer.encode_batch(texts, max(limit - fixed, 1), side)
            lengths = [enc.original_length + fixed for enc in encoded]
        else:
            encoded = self.tokenizer.encode_pairs(list(zip(queries, docs)), limit, side)
            lengths = [enc.original_length for enc in encoded]
        if not truncate:
            for i, enc in enumerate(encoded):
                if enc.truncated:
                    raise self._too_long(queries[i], docs[i], lengths[i], names, ones, 0 if broadcast else i, i)
        if self.yes_no:
            return Pairs([[*self.prefix, *enc.ids, *self.suffix] for enc in encoded], None)
        return Pairs([e.ids for e in encoded], [e.type_ids for e in encoded] if self.types else None)

    def _too_long(self, query: str, doc: str, n: int, names: tuple, ones: tuple[bool, bool],
                  qi: int, di: int) -> IvyError:
        """A 422 for a pair of n tokens, naming its text with more tokens (a long query is the query's fault,
        not every document's); tokenized again only here, on the way out."""
        nq, nd = self.tokenizer.count_tokens([query, doc])
        param = _where(names[0], ones[0], qi) if nq > nd else _where(names[1], ones[1], di)
        return too_long_pair(param, n, self.max_length)

    def _capped(self, texts: Sequence[str], truncate: bool, side: str, name, one: bool) -> list[str]:
        """The per-text character cap of every route: cut with truncate=true, else a 422 naming the text."""
        cap, out = self.char_cap, []
        for i, text in enumerate(texts):
            if len(text) > cap:
                param = _where(name, one, i)
                if not truncate:
                    raise IvyError(Problem.INPUT_TOO_LONG, f"{param} has {len(text)} characters; the limit is "
                                   f"{cap} (send truncate=true to cut it)", param=param, limit=cap)
                text = text[:cap] if side == "right" else text[-cap:]
            out.append(text)
        return out
