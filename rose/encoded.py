"""What a tokenizer answers for a text or a pair, and the longest-first rule that cuts a pair (rose.tokenizer,
rose.spm_tokenizer)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Encoded:
    ids: list[int]  # or an int32 numpy array (rose.tokenizer's encode_batch with arrays=True)
    original_length: int  # tokens before truncation, specials included
    truncated: bool


@dataclass(frozen=True)
class EncodedPair:
    ids: list[int]
    type_ids: list[int]  # 0 for the first text and its specials, 1 for the second (BERT); RoBERTa: all 0
    original_length: int  # tokens before truncation, specials included
    truncated: bool


def longest_first(n1: int, n2: int, budget: int) -> tuple[int, int]:
    """How many tokens of each text a pair keeps within `budget` content tokens: the longer is cut first,
    down to the shorter's length, then both share the budget (the longer, second or not, gets the odd one).
    HF tokenizers' rule (truncation.rs, LongestFirst), so the ids equal CrossEncoder's."""
    if n1 + n2 <= budget:
        return n1, n2
    short, long_ = min(n1, n2), max(n1, n2)
    long_ = short if short > budget else max(short, budget - short)
    if short + long_ > budget:
        short, long_ = budget // 2, budget // 2 + budget % 2
    return (long_, short) if n1 > n2 else (short, long_)
