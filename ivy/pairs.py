"""A cross-encoder's input: each (query, document) pair as one token sequence (tokenization only, no I/O).

- Classifier rerankers (BERT / XLM-R, rose.cross_spec): the tokenizer's pair encoding, [CLS] q [SEP] d [SEP]
  (XLM-R <s> q </s></s> d </s>), cut longest first to the model's length as sentence-transformers'
  CrossEncoder tokenizes; BERT's token types (0 for the query, 1 for the document) travel with the ids.
- Yes/no rerankers (Qwen3-Reranker): its model card's prompt around the pair, system prompt, then
  "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}", then the assistant suffix; only
  the middle is cut (from `side`), never the prompt, as the card's process_inputs does.
Errors name the pair's field (`documents[3]`) and the limit, and never quote the text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ivy.errors import IvyError, Problem
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


class PairEncoder:
    def __init__(self, spec: ModelSpec, tokenizer: Tokenizer, char_cap: int) -> None:
        self.spec, self.tokenizer, self.char_cap = spec, tokenizer, char_cap
        self.max_length = spec.max_length
        self.yes_no = spec.score_head.kind == "yes_no"
        self.types = spec.type_vocab_size > 1
        if self.yes_no:
            if tokenizer.hf is None:
                raise ModelFolderError(f"{spec.model_dir}: a yes/no reranker needs tokenizer.json")
            prefix, suffix = tokenizer.content_encodings([QWEN3_RERANK_PREFIX, QWEN3_RERANK_SUFFIX])
            self.prefix, self.suffix = list(prefix.ids), list(suffix.ids)

    def encode(self, queries: Sequence[str], docs: Sequence[str], truncate: bool, side: str,
               instruction: str | None, names: tuple[str, str]) -> Pairs:
        """queries[i] with docs[i], or one query with every document; `names` are the request's fields for
        them (errors say names[1][i])."""
        queries = self._capped(queries, truncate, side, names[0])
        docs = self._capped(docs, truncate, side, names[1])
        if len(queries) == 1:
            queries = queries * len(docs)
        if self.yes_no:
            if instruction is not None and len(instruction) > self.char_cap:  # it is repeated in every pair
                raise IvyError(Problem.INPUT_TOO_LONG, f"instruction has {len(instruction)} characters; the limit "
                               f"is {self.char_cap}", param="instruction", limit=self.char_cap)
            return self._prompted(queries, docs, truncate, side, instruction or QWEN3_RERANK_INSTRUCTION, names[1])
        encoded = self.tokenizer.encode_pairs(list(zip(queries, docs)), self.max_length, side)
        if not truncate:
            for i, enc in enumerate(encoded):
                if enc.truncated:
                    raise too_long_pair(f"{names[1]}[{i}]", enc.original_length, self.max_length)
        return Pairs([e.ids for e in encoded], [e.type_ids for e in encoded] if self.types else None)

    def _prompted(self, queries: list[str], docs: list[str], truncate: bool, side: str, instruction: str,
                  name: str) -> Pairs:
        fixed = len(self.prefix) + len(self.suffix)
        texts = [f"<Instruct>: {instruction}\n<Query>: {q}\n<Document>: {d}" for q, d in zip(queries, docs)]
        encoded = self.tokenizer.encode_batch(texts, max(self.max_length - fixed, 1), side)
        if not truncate:
            for i, enc in enumerate(encoded):
                if enc.truncated:
                    raise too_long_pair(f"{name}[{i}]", enc.original_length + fixed, self.max_length)
        return Pairs([[*self.prefix, *enc.ids, *self.suffix] for enc in encoded], None)

    def _capped(self, texts: Sequence[str], truncate: bool, side: str, name: str) -> list[str]:
        """The per-text character cap of every route: cut with truncate=true, else a 422 naming the text."""
        cap, out = self.char_cap, []
        for i, text in enumerate(texts):
            if len(text) > cap:
                param = f"{name}[{i}]" if len(texts) > 1 else name
                if not truncate:
                    raise IvyError(Problem.INPUT_TOO_LONG, f"{param} has {len(text)} characters; the limit is "
                                   f"{cap} (send truncate=true to cut it)", param=param, limit=cap)
                text = text[:cap] if side == "right" else text[-cap:]
            out.append(text)
        return out
