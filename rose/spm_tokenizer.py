"""A SentencePiece `.model` as a tokenizer (XLM-R style folders without tokenizer.json), with fairseq's id
offset; rose.tokenizer.Tokenizer uses it when a folder has no tokenizer.json."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from rose.encoded import Encoded, EncodedPair, longest_first


class SentencePieceTokenizer:
    """SentencePiece with XLM-R's fairseq layout: <s>=0 <pad>=1 </s>=2 <unk>=3, piece ids shifted by 1."""

    def __init__(self, path: Path, fairseq: bool, lowercase: bool = False) -> None:
        """lowercase: sentence_bert_config.json's do_lower_case (the text between special tokens lowercased)."""
        import sentencepiece as spm

        self._sp = spm.SentencePieceProcessor(model_file=str(path))
        self.fairseq = fairseq
        self.lowercase = lowercase
        if fairseq:
            self.bos, self.eos, self.offset = 0, 2, 1
            self.vocab_size = self._sp.get_piece_size() + 1 + 1  # + fairseq offset + <mask>
        else:
            self.bos, self.eos, self.offset = self._sp.bos_id(), self._sp.eos_id(), 0
            self.vocab_size = self._sp.get_piece_size()
        # a model trained without <s> or </s> has id -1 for it: no such token around the content
        self.head = [self.bos] if self.bos >= 0 else []
        self.tail = [self.eos] if self.eos >= 0 else []
        # fairseq's special tokens, matched in a text as transformers' tokenizer matches them (its added tokens)
        self.specials = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, "<mask>": self.vocab_size - 1} if fairseq else {}
        self._split = re.compile("(" + "|".join(map(re.escape, self.specials)) + ")") if fairseq else None

    def piece_ids(self, text: str) -> list[int]:
        if self.fairseq:  # the text between special tokens' texts encoded on its own, as transformers does
            unk, out = self._sp.unk_id(), []
            for k, part in enumerate(self._split.split(text)):
                if k % 2:
                    out.append(self.specials[part])
                elif part:
                    out.extend(3 if i == unk else i + self.offset for i in self._sp.encode(self._lower(part)))
            return out
        return self._sp.encode(self._lower(text))

    def _lower(self, text: str) -> str:
        """`text` lowercased character by character (as `tokenizers`' Lowercase) with do_lower_case, else as it is.
        str.lower differs from that only at a final capital sigma (its one context rule), so it serves elsewhere."""
        if not self.lowercase:
            return text
        return text.lower() if "Σ" not in text else "".join(c.lower() for c in text)

    def encode(self, text: str, keep: int, side: str) -> Encoded:
        ids = self.piece_ids(text)
        n = len(ids)
        if n > keep:
            ids = ids[:keep] if side == "right" else ids[n - keep:]
        return Encoded(ids=[*self.head, *ids, *self.tail], original_length=n + len(self.head) + len(self.tail),
                       truncated=n > keep)

    def encode_pair(self, first: str, second: str, limit: int, side: str) -> EncodedPair:
        """RoBERTa's pair layout <s> a </s></s> b </s> (all type 0), cut longest first to `limit`; a model
        without <s> or </s> leaves those out."""
        a, b = self.piece_ids(first), self.piece_ids(second)
        n1, n2 = len(a), len(b)
        head, mid, tail = self.head, self.tail * 2, self.tail
        specials = len(head) + len(mid) + len(tail)
        k1, k2 = longest_first(n1, n2, max(limit - specials, 0))
        a, b = (a[:k1], b[:k2]) if side == "right" else (a[n1 - k1:], b[n2 - k2:])
        ids = [*head, *a, *mid, *b, *tail]
        return EncodedPair(ids, [0] * len(ids), n1 + n2 + specials, (k1, k2) != (n1, n2))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool) -> str:
        """Skipping specials: the ordinary pieces decoded as one run (a word after a dropped <unk> keeps its
        space). Keeping them: runs between specials, each special its own text (<s>, <mask>, ...), and a run
        whose first piece begins a word ("▁") after a special keeps that word's space. fairseq: 0..3 are
        <s> <pad> </s> <unk>, the last id <mask>, the others piece id + 1."""
        pieces = [self._piece(int(i)) for i in ids]
        if skip_special_tokens:
            return self._sp.decode([p for p, special in pieces if special is None])
        out: list[str] = []
        run: list[int] = []

        def flush() -> None:
            if run:
                word = out and self._sp.id_to_piece(run[0]).startswith("\u2581")
                out.append((" " if word else "") + self._sp.decode(run))
                run.clear()

        for piece, special in pieces:
            if special is None:
                run.append(piece)
            else:
                flush()
                out.append(special)
        flush()
        return "".join(out)

    def _piece(self, i: int) -> tuple[int, str | None]:
        """(SentencePiece id, None) for an ordinary piece, (-1, its text) for a special token."""
        if self.fairseq:
            if i < 4:
                return -1, ("<s>", "<pad>", "</s>", "<unk>")[i]
            if i == self.vocab_size - 1:
                return -1, "<mask>"
            i -= self.offset
        if self._sp.is_control(i) or self._sp.is_unknown(i):
            return -1, self._sp.id_to_piece(i)
        return i, None

    def token(self, i: int) -> str:
        """Id i's piece as the vocabulary writes it (transformers' convert_ids_to_tokens), fairseq's specials by
        their names."""
        if self.fairseq:
            if i < 4:
                return ("<s>", "<pad>", "</s>", "<unk>")[i]
            if i == self.vocab_size - 1:
                return "<mask>"
            i -= self.offset
        return self._sp.id_to_piece(i)

    def token_id(self, token: str) -> int | None:
        if self.fairseq and token in ("<s>", "<pad>", "</s>", "<unk>"):
            return {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}[token]
        i = self._sp.piece_to_id(token)
        return None if i == self._sp.unk_id() and token != "<unk>" else i + self.offset
