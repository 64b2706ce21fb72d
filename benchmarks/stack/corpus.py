"""Benchmark inputs from real text with realistic lengths, cut to an exact token count.

Why real text: embedding cost does not depend on the words, but tokenization, request sizes and any
text-dependent path in a peer (templating, truncation, byte-level BPE merges) do; zeros or repeated
tokens hide them. The source is the docstrings of a fixed list of Python standard-library modules
(`inspect.getdoc` of each module and of its public classes, functions and methods, in sorted order).
Docstrings differ between Python versions, so a snapshot taken once lives in
`benchmarks/corpus/stdlib_docstrings.txt` (rebuild: `python -m benchmarks.stack.corpus --write`); the
snapshot is used when present, so every client machine draws the same documents.

A document of N tokens: a seeded start paragraph, the following paragraphs (wrapping around) until
there are at least N tokens, then cut at a token boundary so that the model's tokenizer (the
`tokenizers` library on MODEL_DIR/tokenizer.json, special tokens included) counts exactly N.
Without a tokenizer, N tokens are approximated by round(0.6 * N) whitespace-separated words (the
corpus average under a WordPiece tokenizer; code-heavy paragraphs run longer, so a step at the
server's max length may be rejected, and is then skipped).

Realistic lengths: a lognormal in tokens, `round(exp(Normal(mu, sigma)))` clipped to [lo, hi]; the
defaults (mu = ln 128 = 4.852, sigma = 0.8, 16..512) give a median of 128 tokens and a mean of about
165 after clipping. Everything is deterministic in the seed: an in-process engine benchmark can call
`documents(...)` with the same arguments to get the very same requests.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import inspect
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SNAPSHOT = Path(__file__).resolve().parents[1] / "corpus" / "stdlib_docstrings.txt"
WORDS_PER_TOKEN = 0.6  # this corpus under the MiniLM WordPiece: 0.61 words a token (code-heavy: 0.25)

# Modules with long, prose-like docstrings that import without side effects on any Linux Python.
SOURCE_MODULES = (
    "argparse", "ast", "asyncio", "base64", "calendar", "codecs", "collections", "concurrent.futures",
    "configparser", "contextlib", "copy", "csv", "dataclasses", "datetime", "decimal", "difflib",
    "doctest", "email.message", "enum", "fractions", "ftplib", "functools", "gettext", "hashlib",
    "heapq", "http.client", "http.cookies", "imaplib", "inspect", "io", "ipaddress", "itertools",
    "json", "locale", "logging", "mailbox", "mimetypes", "numbers", "operator", "optparse", "os",
    "pathlib", "pdb", "pickle", "pkgutil", "platform", "pprint", "queue", "random", "re", "sched",
    "secrets", "selectors", "shlex", "shutil", "smtplib", "socket", "statistics", "string", "struct",
    "subprocess", "tarfile", "tempfile", "textwrap", "threading", "timeit", "tokenize", "trace",
    "traceback", "types", "typing", "unittest", "urllib.parse", "urllib.request", "uuid", "warnings",
    "wave", "weakref", "xml.etree.ElementTree", "zipfile", "zipimport",
)


class CorpusError(RuntimeError):
    """The corpus cannot produce the requested input (too little text, tokenizer missing)."""


def _docstrings(module_name: str) -> list[str]:
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return []
    docs = [inspect.getdoc(module) or ""]
    for name, obj in sorted(vars(module).items()):
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        docs.append(inspect.getdoc(obj) or "")
        if inspect.isclass(obj):
            for attr_name, attr in sorted(vars(obj).items()):
                if attr_name.startswith("_"):
                    continue
                if inspect.isfunction(attr) or isinstance(attr, (property, staticmethod, classmethod)):
                    docs.append(inspect.getdoc(attr) or "")
    return [d for d in docs if d.strip()]


def build_text() -> str:
    """The corpus text from this Python's standard library: paragraphs separated by blank lines."""
    paragraphs: list[str] = []
    for name in SOURCE_MODULES:
        for doc in _docstrings(name):
            paragraphs.extend(p.strip() for p in doc.split("\n\n") if len(p.split()) >= 3)
    return "\n\n".join(paragraphs) + "\n"


@dataclass(frozen=True)
class Corpus:
    """Paragraphs of real text plus where they came from (recorded in every result's env)."""

    paragraphs: tuple[str, ...]
    source: str
    sha256: str

    @classmethod
    def load(cls) -> "Corpus":
        if SNAPSHOT.is_file():
            text, source = SNAPSHOT.read_text(encoding="utf-8"), f"snapshot {SNAPSHOT.name}"
        else:
            text, source = build_text(), "stdlib docstrings built at run time (no snapshot)"
        paragraphs = tuple(p for p in text.split("\n\n") if p.strip())
        if not paragraphs:
            raise CorpusError("the corpus is empty")
        return cls(paragraphs, source, hashlib.sha256(text.encode()).hexdigest())

    def describe(self) -> dict[str, Any]:
        return {"source": self.source, "modules": "stdlib docstrings via inspect.getdoc",
                "paragraphs": len(self.paragraphs), "sha256": self.sha256}


class TokenCounter:
    """Counts tokens the way the served model does (tokenizers on tokenizer.json), or approximates.

    Truncation and padding stored in tokenizer.json are switched off: they would cap every count.
    """

    def __init__(self, model_dir: str | Path | None) -> None:
        self.model_dir = None if model_dir is None else Path(model_dir)
        self._tok = None
        if self.model_dir is not None:
            from tokenizers import Tokenizer

            path = self.model_dir / "tokenizer.json" if self.model_dir.is_dir() else self.model_dir
            if not path.is_file():
                raise CorpusError(f"no tokenizer.json at {path}")
            self._tok = Tokenizer.from_file(str(path))
            self._tok.no_truncation()
            self._tok.no_padding()
        self.special = self.count("") if self._tok is not None else 0

    @property
    def exact(self) -> bool:
        return self._tok is not None

    def count(self, text: str) -> int:
        if self._tok is None:
            return max(1, round(len(text.split()) / WORDS_PER_TOKEN))
        return len(self._tok.encode(text).ids)

    def describe(self) -> dict[str, Any]:
        if self._tok is None:
            return {"kind": "approximate", "words_per_token": WORDS_PER_TOKEN,
                    "note": "no --tokenizer given: lengths are approximated by words, not exact tokens"}
        return {"kind": "exact", "tokenizer": str(self.model_dir), "special_tokens_per_text": self.special}

    def cut(self, text: str, n_tokens: int) -> str | None:
        """A prefix of `text` counted as exactly `n_tokens` (special tokens included), else None."""
        if self._tok is None:
            words = text.split()
            n_words = max(1, round(n_tokens * WORDS_PER_TOKEN))
            return " ".join(words[:n_words]) if len(words) >= n_words else None
        enc = self._tok.encode(text, add_special_tokens=False)
        k = n_tokens - self.special
        if k < 1:
            raise CorpusError(f"{n_tokens} tokens is not more than the {self.special} special tokens")
        for _ in range(12):  # a cut can merge or split a token at the edge; steer k until exact
            if k < 1 or k > len(enc.offsets):
                return None
            candidate = text[: enc.offsets[k - 1][1]].rstrip()
            got = self.count(candidate)
            if got == n_tokens:
                return candidate
            k += n_tokens - got
        return None


def lognormal_lengths(rng: random.Random, count: int, mu: float, sigma: float, lo: int, hi: int) -> list[int]:
    """Token counts drawn from a lognormal, clipped to [lo, hi]."""
    return [min(hi, max(lo, round(math.exp(rng.gauss(mu, sigma))))) for _ in range(count)]


class DocumentMaker:
    """Makes documents of exact token counts from the corpus; deterministic given the rng."""

    def __init__(self, corpus: Corpus, counter: TokenCounter) -> None:
        self.corpus = corpus
        self.counter = counter

    def document(self, rng: random.Random, n_tokens: int) -> str:
        paragraphs = self.corpus.paragraphs
        for _attempt in range(20):
            start = rng.randrange(len(paragraphs))
            parts: list[str] = []
            chars = 0
            for i in range(len(paragraphs)):  # enough text: ~4 chars a token, doubled for safety
                parts.append(paragraphs[(start + i) % len(paragraphs)])
                chars += len(parts[-1]) + 2
                if chars >= 8 * n_tokens + 64:
                    break
            text = self.counter.cut("\n\n".join(parts), n_tokens)
            if text:
                return text
        raise CorpusError(f"could not cut a document of {n_tokens} tokens from the corpus")

    def documents(self, rng: random.Random, lengths: list[int]) -> list[str]:
        return [self.document(rng, n) for n in lengths]


def documents(model_dir: str | Path | None, count: int, seed: int, mu: float = math.log(128),
              sigma: float = 0.8, lo: int = 16, hi: int = 512) -> list[str]:
    """`count` lognormal-length documents, the same for every caller with the same arguments."""
    rng = random.Random(seed)
    maker = DocumentMaker(Corpus.load(), TokenCounter(model_dir))
    return maker.documents(rng, lognormal_lengths(rng, count, mu, sigma, lo, hi))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write or inspect the benchmark corpus snapshot.")
    parser.add_argument("--write", action="store_true", help=f"rebuild {SNAPSHOT} from this Python")
    args = parser.parse_args(argv)
    if args.write:
        SNAPSHOT.parent.mkdir(parents=True, exist_ok=True)
        SNAPSHOT.write_text(build_text(), encoding="utf-8")
    corpus = Corpus.load()
    print(corpus.describe())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
