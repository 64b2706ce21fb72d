"""Input parsing for the request schemas (ivy.schemas): `input`-like fields are parsed by hand so that
errors name the exact element (`input[3]`) and the limit, and empty inputs get 400 as RELIABILITY.md asks;
the parsers raise IvyError, which pydantic lets through untouched."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import Field, PlainValidator, WithJsonSchema

from ivy.errors import IvyError, Problem

EncodingFormat = Literal["float", "base64", "base64_int8", "base64_binary"]
RawEncodingFormat = Literal["float", "base64", "base64_int8", "base64_binary", "bytes", "bytes_only"]  # and vLLM's
InputType = Literal["query", "document", "search_query", "search_document", "passage"]
Side = Literal["right", "left"]


@dataclass(frozen=True)
class Inputs:
    """A parsed `input`: either texts, or token id sequences (never both)."""

    texts: list[str] | None = None
    ids: list[list[int]] | None = None
    flat: bool = False  # one text sent as a string, or ids as one flat list: errors name input (input[j] its id)

    def __len__(self) -> int:
        return len(self.texts if self.texts is not None else self.ids or [])


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _all_ints(values: list) -> bool:
    """Every element an int (JSON's numbers without a fraction; never a bool), checked in C: a Python test per
    id cost 0.86 ms for 4096 ids on a CPU, this 0.11 ms (benchmarks/NOTES.md, "Token ids in the gateway")."""
    return list(map(type, values)).count(int) == len(values)


def _first_not_int(values: list) -> int:
    """Where _all_ints failed (the same test: the type itself, so no int subclass passes one and not the other)."""
    return next(i for i, v in enumerate(values) if type(v) is not int)


class ItemLimits(NamedTuple):
    inputs: int  # --max-inputs-per-request
    chunks: int  # --max-chunks-per-request


# The serving worker's limits, set by Gateway.read_request before the body is validated: a list over them is refused
# by its count before its items are checked one by one (RELIABILITY 3: a 2 MB body of 500 k one-id lists was
# checked item by item on the event loop, ~0.5 s, before the routes' own count refused it). None: no early count
# (the parsers used outside a request); the routes count again (Gateway.check_count), so nothing relies on this.
item_limits: ContextVar[ItemLimits | None] = ContextVar("ivy_item_limits", default=None)


def too_many(n: int, limit: int, param: str) -> IvyError:
    return IvyError(Problem.TOO_MANY_INPUTS, f"{param} has {n} items; at most {limit} are allowed per request",
                    param=param, limit=limit)


def _count(n: int, param: str, reserved: int = 0) -> None:
    """A list of n items refused when over the request's input limit, less `reserved` (items the route adds)."""
    limits = item_limits.get()
    if limits is not None and n > limits.inputs - reserved:
        raise too_many(n, limits.inputs - reserved, param)


def _empty(param: str) -> IvyError:
    return IvyError(Problem.EMPTY_INPUT, f"{param} must not be empty", param=param)


def _wrong(param: str, expected: str) -> IvyError:
    return IvyError(Problem.INVALID_PARAMETER, f"{param}: expected {expected}", param=param)


def parse_inputs(value: Any, name: str = "input") -> Inputs:
    """OpenAI's `input` (TEI's `inputs`, named by `name`): a string, a list of strings, a list of token ids,
    or a list of token id lists."""
    if isinstance(value, str):
        if not value:
            raise _empty(name)
        return Inputs(texts=[value], flat=True)
    if not isinstance(value, list):
        raise _wrong(name, "a string, a list of strings, a list of token ids or a list of token id lists")
    if not value:
        raise _empty(name)
    first = value[0]
    if not _is_int(first):  # a flat list of ids is one input
        _count(len(value), name)
    if isinstance(first, str):
        for i, v in enumerate(value):
            if not isinstance(v, str):
                raise _wrong(f"{name}[{i}]", "a string like the other inputs")
            if not v:
                raise _empty(f"{name}[{i}]")
        return Inputs(texts=value)
    if _is_int(first):
        if not _all_ints(value):
            raise _wrong(f"{name}[{_first_not_int(value)}]", "a token id (integer) like the other elements")
        return Inputs(ids=[value], flat=True)
    if isinstance(first, list):
        for i, seq in enumerate(value):
            if not isinstance(seq, list):
                raise _wrong(f"{name}[{i}]", "a list of token ids like the other inputs")
            if not seq:
                raise _empty(f"{name}[{i}]")
            if not _all_ints(seq):
                raise _wrong(f"{name}[{i}][{_first_not_int(seq)}]", "a token id (integer)")
        return Inputs(ids=value)
    raise _wrong(f"{name}[0]", "a string, a token id or a list of token ids")


@dataclass(frozen=True)
class PredictInputs:
    """text-embeddings-inference's /predict `inputs`: each item a text (1-tuple) or a (text, text_pair) pair.
    `shape`: how they came, "text" (one string), "list" (one [text] or [text, text_pair]) or "batch" (a list of
    those lists): TEI answers a batch with a list per input, anything else with the one input's list."""

    items: list[tuple[str, ...]]
    shape: Literal["text", "list", "batch"]

    def name(self, k: int, j: int) -> str:
        """How an error names text j of item k, as the client sent it."""
        return {"text": "inputs", "list": f"inputs[{j}]", "batch": f"inputs[{k}][{j}]"}[self.shape]


def parse_predict_inputs(value: Any) -> PredictInputs:
    """As TEI reads /predict's `inputs`: a string, [string] or [string, string] (one text or one pair), or a batch
    [[string], [string, string], ...] of them mixed; errors name the element (inputs[2][1])."""
    if isinstance(value, str):
        return PredictInputs([(one_text(value, "inputs"),)], "text")
    if not isinstance(value, list):
        raise _wrong("inputs", "a string, a pair [string, string] or a batch [[string], [string, string], ...]")
    if not value:
        raise _empty("inputs")
    if not isinstance(value[0], list):
        return PredictInputs([_sequence(value, "inputs", "inputs[{j}]")], "list")
    _count(len(value), "inputs")
    return PredictInputs([_sequence(v, f"inputs[{k}]", f"inputs[{k}][{{j}}]") for k, v in enumerate(value)], "batch")


def _sequence(value: Any, name: str, each: str) -> tuple[str, ...]:
    """One /predict input: a list of one text or of a pair of texts (`each`: how text j is named)."""
    if not isinstance(value, list) or not 1 <= len(value) <= 2:
        raise _wrong(name, "[string] or a pair [string, string]")
    return tuple(one_text(v, each.format(j=j)) for j, v in enumerate(value))


def parse_documents_of_chunks(value: Any) -> list[list[str]]:
    """Perplexity's `input`: a list of documents, each a non-empty list of non-empty chunk strings."""
    if not isinstance(value, list):
        raise _wrong("input", "a list of documents, each a list of chunk strings")
    if not value:
        raise _empty("input")
    _count(len(value), "input")
    limits = item_limits.get()
    if limits is not None:
        chunks = sum(len(doc) for doc in value if isinstance(doc, list))
        if chunks > limits.chunks:
            raise too_many(chunks, limits.chunks, "input chunks")
    for i, doc in enumerate(value):
        if not isinstance(doc, list):
            raise _wrong(f"input[{i}]", "a list of chunk strings")
        if not doc:
            raise _empty(f"input[{i}]")
        for j, chunk in enumerate(doc):
            if not isinstance(chunk, str):
                raise _wrong(f"input[{i}][{j}]", "a string")
            if not chunk:
                raise _empty(f"input[{i}][{j}]")
    return value


class Texts(list):
    """Texts as parse_texts reads them; `one`: sent as one string, so an error names the field, not field[0]."""

    one = False


def sent_as_one(texts: list[str], single: bool = False) -> bool:
    """Whether an error about texts[0] names the field itself: one text sent as a string, or (`single`) a field
    that is always one text (rerank's query) passed as a plain list of one."""
    return texts.one if isinstance(texts, Texts) else single and len(texts) == 1


def parse_texts(value: Any, name: str, reserved: int = 0) -> list[str]:
    """A string or a non-empty list of non-empty strings; rerank documents may be {"text": ...} objects.
    reserved: inputs the route adds to the list's (/similarity's source sentence), counted against the limit."""
    if isinstance(value, str):
        if not value:
            raise _empty(name)
        texts = Texts([value])
        texts.one = True
        return texts
    if not isinstance(value, list):
        raise _wrong(name, "a string or a list of strings")
    if not value:
        raise _empty(name)
    _count(len(value), name, reserved)
    out = []
    for i, v in enumerate(value):
        if isinstance(v, dict) and "text" in v:
            v = v["text"]
            if not isinstance(v, str):
                raise _wrong(f"{name}[{i}].text", "a string")
        if not isinstance(v, str):
            raise _wrong(f"{name}[{i}]", 'a string or an object {"text": string}')
        if not v:
            raise _empty(f"{name}[{i}]")
        out.append(v)
    return Texts(out)


def one_text(value: Any, name: str) -> str:
    """A non-empty string, else the error naming `name`."""
    if not isinstance(value, str):
        raise _wrong(name, "a string")
    if not value:
        raise _empty(name)
    return value


_ID_LISTS = {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}}
EmbeddingInput = Annotated[Inputs, PlainValidator(parse_inputs), WithJsonSchema({"anyOf": [
    {"type": "string"}, {"type": "array", "items": {"type": "string"}},
    {"type": "array", "items": {"type": "integer"}}, _ID_LISTS]})]
DocumentsOfChunks = Annotated[list[list[str]], PlainValidator(parse_documents_of_chunks), WithJsonSchema(
    {"type": "array", "items": {"type": "array", "items": {"type": "string", "minLength": 1}}})]
TextOrTexts = Annotated[list[str], WithJsonSchema(
    {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]})]
RerankDocuments = Annotated[list[str], PlainValidator(lambda v: parse_texts(v, "documents")), WithJsonSchema(
    {"type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "object", "properties": {
        "text": {"type": "string"}}, "required": ["text"]}]}})]
Query = Annotated[str, PlainValidator(lambda v: one_text(v, "query")), WithJsonSchema({"type": "string", "minLength": 1})]
Dimensions = Annotated[int, Field(ge=1, description="Matryoshka: keep the first N dimensions, then re-normalize.")]


# vLLM's newer names for /score's two sides (ScoreQueriesDocumentsRequest, ScoreQueriesItemsRequest,
# ScoreDataRequest), read as text_1 and text_2 and named as sent in errors
SCORE_SIDES = (("queries", "documents"), ("queries", "items"), ("data_1", "data_2"))


def score_side(value: Any, name: str) -> list[str]:
    """parse_texts, passing through what score_sides already parsed (its Texts keep `one`: an error about a
    side sent as one string names the side, not side[0])."""
    return value if isinstance(value, Texts) else parse_texts(value, name)


def score_sides(data: dict) -> tuple[tuple[str, str], dict]:
    """/score's two sides as (the names sent, the body with them as text_1 and text_2): text_1 and text_2 (which
    win over newer names sent beside both, as a field of ours wins over a peer's alias), or exactly one of vLLM's
    newer pairs (SCORE_SIDES); a null field counts as absent. One of text_1 / text_2 beside newer names, a newer
    side without its partner, or a newer name beside the pair chosen is a 422 naming a field the client sent."""
    old = [k for k in ("text_1", "text_2") if data.get(k) is not None]
    newer = list(dict.fromkeys(k for pair in SCORE_SIDES for k in pair if data.get(k) is not None))
    if len(old) == 2 or not newer:
        return ("text_1", "text_2"), data
    if old:
        raise IvyError(Problem.INVALID_PARAMETER, f"{old[0]} is mixed with vLLM's newer names for the sides; send "
                       "text_1 and text_2, or queries with documents or items, or data_1 with data_2", param=old[0])
    for first, second in SCORE_SIDES:
        if data.get(first) is not None and data.get(second) is not None:
            extra = [k for k in newer if k not in (first, second)]
            if extra:
                raise IvyError(Problem.INVALID_PARAMETER, f"{extra[0]} is sent beside {first} and {second}: send "
                               "one pair of sides", param=extra[0])
            return (first, second), {**data, "text_1": parse_texts(data[first], first),
                                     "text_2": parse_texts(data[second], second)}
    partner = {"queries": "documents or items", "documents": "queries", "items": "queries", "data_1": "data_2",
               "data_2": "data_1"}[newer[0]]
    raise IvyError(Problem.INVALID_PARAMETER, f"{newer[0]} needs {partner} beside it (vLLM's sides of /score)",
                   param=newer[0])
