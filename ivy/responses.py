"""The public HTTP schema's answers: every response body Ivy returns, as pydantic models.

The routes build their answers as plain dicts (serialized with orjson); these models document the shapes in
/openapi.json and /docs (`response_model`), and tests check answers against them. The requests are in
ivy.schemas.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, RootModel


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


class TeiRerankResult(BaseModel):
    """One of text-embeddings-inference's rerank answers (a list of them, by score)."""

    index: int
    score: float
    text: str | None = Field(default=None, description="The text, with return_text.")


class VoyageRerankResult(BaseModel):
    """One of Voyage's rerank answers (`data`, by score): the document as a string, with return_documents only."""

    index: int
    relevance_score: float
    document: str | None = None


class RerankResponse(BaseModel):
    """Cohere's, Jina's and vLLM's answer (`results`), with Voyage's beside it (`object` and `data`: the voyageai
    SDK reads those), the same order and scores."""

    id: str
    object: str = "list"
    model: str
    results: list[RerankResult]
    data: list[VoyageRerankResult]
    usage: Usage


class SparseValue(BaseModel):
    """One weight of a sparse vector (text-embeddings-inference's SparseValue): a vocabulary id and its weight."""

    index: int
    value: float


class SparseEmbedResponse(RootModel[list[list[SparseValue]]]):
    """POST /embed_sparse's answer, text-embeddings-inference's EmbedSparseResponse: per input its non-zero
    weights, ids ascending."""


class Prediction(BaseModel):
    """One label's score in /predict's answer (text-embeddings-inference's Prediction)."""

    score: float
    label: str


class ClassifyData(BaseModel):
    index: int
    label: str
    probs: list[float]
    num_classes: int


class ClassifyResponse(BaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[ClassifyData]
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    max_model_len: int
    dimensions: int
    tasks: list[Literal["embed", "rerank", "classify", "sparse", "multi-vector"]] = Field(
        description="What the model does: embed (/v1/embeddings; /v1/score and /v1/rerank by cosine), rerank (a "
                    "cross-encoder: /v1/score and /v1/rerank score each pair), classify (/predict, /classify), "
                    "sparse, multi-vector.")


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenizeResponse(BaseModel):
    """POST /tokenize's answer to vLLM's body (vLLM's TokenizeResponse)."""

    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = Field(default=None, description=(
        "With return_token_strs: each id's token as the vocabulary writes it (transformers' convert_ids_to_tokens); "
        "else null."))


class SimpleToken(BaseModel):
    """One token in POST /tokenize's answer to text-embeddings-inference's body (its SimpleToken)."""

    id: int
    text: str = Field(description="A special token's vocabulary string; any other's span of the text it covers.")
    special: bool
    start: int | None = Field(description="UTF-8 byte offset in the text (the prompt included); null for a "
                                          "special token.")
    stop: int | None = Field(description="UTF-8 byte offset where the token ends; null for a special token.")


class TeiTokenizeResponse(RootModel[list[list[SimpleToken]]]):
    """POST /tokenize's answer to text-embeddings-inference's body (its TokenizeResponse): a list of tokens per
    input, a single string's included."""
