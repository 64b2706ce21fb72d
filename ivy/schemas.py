"""The public HTTP schema: every request and response body Ivy speaks, as pydantic models, in one file.

Requests follow the APIs clients already use: OpenAI embeddings (plus TEI/vLLM-style extensions),
Perplexity contextualized embeddings, vLLM's score and Cohere/Jina rerank. `input`-like fields are parsed
by hand (`parse_*`) so that errors name the exact element (`input[3]`) and the limit, and empty inputs get
400 as RELIABILITY.md asks; those parsers raise IvyError, which pydantic lets through untouched.
Responses are built as plain dicts (serialized with orjson); their models here document the shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, WithJsonSchema, model_validator

from ivy.errors import IvyError, Problem

EncodingFormat = Literal["float", "base64", "base64_int8", "base64_binary"]
InputType = Literal["query", "document", "search_query", "search_document", "passage"]
Side = Literal["right", "left"]


@dataclass(frozen=True)
class Inputs:
    """A parsed `input`: either texts, or token id sequences (never both)."""

    texts: list[str] | None = None
    ids: list[list[int]] | None = None

    def __len__(self) -> int:
        return len(self.texts if self.texts is not None else self.ids or [])


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


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
        return Inputs(texts=[value])
    if not isinstance(value, list):
        raise _wrong(name, "a string, a list of strings, a list of token ids or a list of token id lists")
    if not value:
        raise _empty(name)
    first = value[0]
    if isinstance(first, str):
        for i, v in enumerate(value):
            if not isinstance(v, str):
                raise _wrong(f"{name}[{i}]", "a string like the other inputs")
            if not v:
                raise _empty(f"{name}[{i}]")
        return Inputs(texts=value)
    if _is_int(first):
        for i, v in enumerate(value):
            if not _is_int(v):
                raise _wrong(f"{name}[{i}]", "a token id (integer) like the other elements")
        return Inputs(ids=[value])
    if isinstance(first, list):
        for i, seq in enumerate(value):
            if not isinstance(seq, list):
                raise _wrong(f"{name}[{i}]", "a list of token ids like the other inputs")
            if not seq:
                raise _empty(f"{name}[{i}]")
            for j, v in enumerate(seq):
                if not _is_int(v):
                    raise _wrong(f"{name}[{i}][{j}]", "a token id (integer)")
        return Inputs(ids=value)
    raise _wrong(f"{name}[0]", "a string, a token id or a list of token ids")


def parse_documents_of_chunks(value: Any) -> list[list[str]]:
    """Perplexity's `input`: a list of documents, each a non-empty list of non-empty chunk strings."""
    if not isinstance(value, list):
        raise _wrong("input", "a list of documents, each a list of chunk strings")
    if not value:
        raise _empty("input")
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


def parse_texts(value: Any, name: str) -> list[str]:
    """A string or a non-empty list of non-empty strings; rerank documents may be {"text": ...} objects."""
    if isinstance(value, str):
        if not value:
            raise _empty(name)
        return [value]
    if not isinstance(value, list):
        raise _wrong(name, "a string or a list of strings")
    if not value:
        raise _empty(name)
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
    return out


def _query(value: Any) -> str:
    if not isinstance(value, str):
        raise _wrong("query", "a string")
    if not value:
        raise _empty("query")
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
Query = Annotated[str, PlainValidator(_query), WithJsonSchema({"type": "string", "minLength": 1})]
Dimensions = Annotated[int, Field(ge=1, description="Matryoshka: keep the first N dimensions, then re-normalize.")]


_SAME_MEANING = {"top_k": "top_n", "truncation": "truncate", "normalized": "normalize"}
PEER_ALIASES = frozenset({"truncation_direction", *_SAME_MEANING})


class _Request(BaseModel):
    # Strict: "dimensions": "128" is a 422, not silently coerced. Unknown fields are ignored (other servers
    # and SDKs send their own), except near misses of ours (ivy.body.check_misspelled_fields).
    model_config = ConfigDict(strict=True, extra="ignore")

    model: str | None = Field(default=None, description="The served model's name; omitted = the served model.")

    @model_validator(mode="before")
    @classmethod
    def _peer_names(cls, data: Any) -> Any:
        """Other servers' names for our fields: text-embeddings-inference's truncation_direction ("Left" |
        "Right"), Voyage's top_k (rerank) and truncation (bool), Jina's normalized. Listed in PEER_ALIASES,
        which the misspelling check skips; ours wins when both are sent."""
        if not isinstance(data, dict):
            return data
        if "truncation_direction" in data and "truncation_side" not in data:
            side = data["truncation_direction"]
            data = {**data, "truncation_side": side.lower() if isinstance(side, str) else side}
        for theirs, ours in _SAME_MEANING.items():
            if theirs in data and ours not in data and ours in cls.model_fields:
                data = {**data, ours: data[theirs]}
        return data


class EmbeddingsRequest(_Request):
    input: EmbeddingInput
    encoding_format: EncodingFormat | None = Field(
        default=None, description="float (default), base64 (LE float32), base64_int8, base64_binary (LSB first); "
                                  "models with native int8 output default to base64_int8.")
    dimensions: Dimensions | None = None
    user: str | None = None
    normalize: bool | None = Field(default=None, description="L2-normalize; omitted = the model's own default.")
    truncate: bool | None = Field(default=None, description="Cut over-long inputs; omitted = the server default.")
    truncation_side: Side = "right"
    input_type: InputType | None = Field(default=None, description="query or document templating.")
    prompt_name: str | None = Field(default=None, description="A sentence-transformers prompt of the model.")


class ContextualizedEmbeddingsRequest(_Request):
    input: DocumentsOfChunks
    encoding_format: EncodingFormat | None = None
    dimensions: Dimensions | None = None
    normalize: bool | None = None


class ScoreRequest(_Request):
    """vLLM's /score: text_1 against each of text_2 (or pairwise when both are lists of equal length)."""

    text_1: Annotated[TextOrTexts, PlainValidator(lambda v: parse_texts(v, "text_1"))]
    text_2: Annotated[TextOrTexts, PlainValidator(lambda v: parse_texts(v, "text_2"))]
    truncate: bool | None = None
    truncation_side: Side = "right"


class RerankRequest(_Request):
    """Cohere's and Jina's rerank request."""

    query: Query
    documents: RerankDocuments
    top_n: Annotated[int, Field(ge=1)] | None = None
    return_documents: bool = False
    truncate: bool | None = None
    truncation_side: Side = "right"


class TeiEmbedRequest(_Request):
    """text-embeddings-inference's /embed request (its truncation_direction is read as truncation_side)."""

    inputs: Annotated[Inputs, PlainValidator(lambda v: parse_inputs(v, "inputs")), WithJsonSchema({"anyOf": [
        {"type": "string"}, {"type": "array", "items": {"type": "string"}},
        {"type": "array", "items": {"type": "integer"}}, _ID_LISTS]})]
    normalize: bool = True
    truncate: bool | None = None
    truncation_side: Side = "right"
    prompt_name: str | None = None
    dimensions: Dimensions | None = None


class TokenizeRequest(_Request):
    """vLLM's /tokenize: the token ids of one text, never truncated."""

    prompt: str
    add_special_tokens: bool = True


# ---- responses (documentation of the shapes the routes return) ----

class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingObject(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingsResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingObject]
    model: str
    usage: Usage


class DocumentEmbeddings(BaseModel):
    object: Literal["list"] = "list"
    index: int
    data: list[EmbeddingObject]


class ContextualizedEmbeddingsResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[DocumentEmbeddings]
    model: str
    usage: Usage


class ScoreObject(BaseModel):
    object: Literal["score"] = "score"
    index: int
    score: float


class ScoreResponse(BaseModel):
    id: str
    object: Literal["list"] = "list"
    model: str
    data: list[ScoreObject]
    usage: Usage


class RerankDocument(BaseModel):
    text: str


class RerankResult(BaseModel):
    index: int
    relevance_score: float
    document: RerankDocument | None = None


class RerankResponse(BaseModel):
    id: str
    model: str
    results: list[RerankResult]
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    max_model_len: int
    dimensions: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
