"""The public HTTP schema's requests: every request body Ivy reads, as pydantic models (the answers: ivy.responses).

Requests follow the APIs clients already use: OpenAI embeddings (plus TEI/vLLM-style extensions),
Perplexity contextualized embeddings, vLLM's score and Cohere/Jina rerank. `input`-like fields are parsed
by hand in ivy.inputs, so that errors name the exact element (`input[3]`) and the limit.
vLLM's /pooling, whose request refuses many vLLM-only fields by name, has its models in ivy.pooling; the token
routes' bodies (/tokenize, /detokenize, /decode) are in ivy.token_schemas.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, PrivateAttr, WithJsonSchema, model_validator

from ivy.lanes import PRIORITY_RULE, lane_name
from ivy.inputs import (_ID_LISTS, Dimensions,
                        DocumentsOfChunks, EmbeddingInput, EncodingFormat, Inputs, InputType, PredictInputs, Query,
                        RawEncodingFormat, RerankDocuments, Side, TextOrTexts, one_text, parse_inputs,
                        parse_predict_inputs, parse_texts, score_side, score_sides)
from ivy.peer_fields import read_peer_fields, read_peer_names
from ivy.vllm_fields import refuse_unserved

RAW = ("the logits before the model's activation (a sigmoid reranker's, Qwen3-Reranker's logit(yes) - "
       "logit(no)); cosine and MaxSim scores, and a reranker without an activation, are raw already.")
INSTRUCTION = ("The task line of a yes/no reranker's prompt (Qwen3-Reranker's <Instruct>); omitted = its default, "
               "web search. Other models refuse it.")
SCORING = ("cosine (dense unit vectors) or maxsim (late interaction over the token vectors, BGE-M3 / ColBERT); "
           "omitted = cosine for a model that embeds (BGE-M3 included), maxsim for a multi-vector-only model. "
           "Cross-encoders refuse it.")
Scoring = Literal["cosine", "maxsim"]
# vLLM's base64 and bytes values (ivy.embed_dtypes.wire_dtype), on /v1/embeddings and /pooling
EmbedDtype = Literal["float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2"]
Endianness = Literal["native", "little", "big"]
EMBED_DTYPE = ("vLLM's: base64's and bytes' values as float32 (omitted), float16, bfloat16, fp8_e4m3 or fp8_e5m2 "
               "(torch's float8_e4m3fn, saturating at 448, and float8_e5m2; each rounded to nearest even as torch "
               "casts); float ignores it.")
ENDIANNESS = "vLLM's: base64's and bytes' byte order; native (omitted) is this server's, little-endian on x86 and ARM."
MAX_TOKENS_PER_DOC = ("Cohere v2's: each document cut to its first k tokens (special tokens not counted) before "
                      "scoring, and truncate on; omitted at /v2/rerank: truncate on, as Cohere's default cuts.")
# Every score / rerank body's (vLLM's, Cohere's / Jina's and TEI's shapes): one meaning, read in one place
# (ivy.routes_scoring's _truncation)
TRUNCATE_PROMPT_TOKENS = ("vLLM's: -1 cuts to the model's length, k keeps k tokens of each text (special tokens "
                          "included), of each pair for a cross-encoder; omitted: `truncate`.")


class _Body(BaseModel):
    # Strict: "dimensions": "128" is a 422, not silently coerced. Unknown fields are ignored (other servers
    # and SDKs send their own), except near misses of ours (ivy.body.check_misspelled_fields).
    model_config = ConfigDict(strict=True, extra="ignore")
    peer_prefix: ClassVar[str] = ""  # where the model sits in a request ("parameters."), for the errors above

    @model_validator(mode="before")
    @classmethod
    def _peer_names(cls, data: Any) -> Any:
        """Other servers' names for our fields (ivy.peer_fields.read_peer_names); ours wins when both are sent."""
        return read_peer_names(data, cls.model_fields, cls.peer_prefix) if isinstance(data, dict) else data


class _Request(_Body):
    model: str | None = Field(default=None, description="The served model's name; omitted = the served model.")


Priority = Annotated[str | None, PlainValidator(lambda v: None if v is None else lane_name(v)), WithJsonSchema({
    "anyOf": [{"type": "string", "enum": ["interactive", "bulk"]}, {"type": "number"}],
    "description": f"Priority lane: {PRIORITY_RULE}."})]


class EmbeddingsRequest(_Request):
    input: EmbeddingInput
    encoding_format: RawEncodingFormat | None = Field(
        default=None, description="float (default), base64 (LE float32), base64_int8, base64_binary (LSB first), "
                                  "vLLM's bytes and bytes_only (every row's bytes back to back, application/"
                                  "octet-stream; bytes: the rows' places in a `metadata` header, ~102 bytes a row, "
                                  "over some clients' header limits past ~640 rows); models with native "
                                  "int8 output default to base64_int8.")
    embed_dtype: EmbedDtype | None = Field(default=None, description=EMBED_DTYPE)
    endianness: Endianness | None = Field(default=None, description=ENDIANNESS)
    dimensions: Dimensions | None = None
    user: str | None = None
    normalize: bool | None = Field(default=None, description="L2-normalize; omitted = the model's own default.")
    truncate: bool | None = Field(default=None, description="Cut over-long inputs; omitted = the server default.")
    truncation_side: Side = "right"
    truncate_prompt_tokens: int | None = Field(default=None, description="vLLM's: -1 cuts to the model's length, "
                                               "k keeps k tokens (a text's special tokens included).")
    input_type: InputType | None = Field(default=None, description="query or document templating.")
    prompt_name: str | None = Field(default=None, description="A sentence-transformers prompt of the model.")
    priority: Priority = Field(default=None, description=f"Priority lane: {PRIORITY_RULE}.")
    late_chunking: bool | None = Field(default=None, description="Jina's: true embeds the inputs as one document's "
                                       "chunks, each with the others as context (as /v1/contextualizedembeddings).")

    @model_validator(mode="before")
    @classmethod
    def _peers_fields(cls, data: Any) -> Any:
        """vLLM's fields of this request that Ivy cannot honour (add_special_tokens false, chat messages, ...),
        refused by name as /pooling refuses them; other APIs' (Jina's, Nomic's, Gemini's, ...) read or refused
        (ivy.peer_fields)."""
        if isinstance(data, dict):
            data = read_peer_fields(data)
            refuse_unserved(data)
        return data


class ContextualizedEmbeddingsRequest(_Request):
    input: DocumentsOfChunks
    encoding_format: EncodingFormat | None = None
    dimensions: Dimensions | None = None
    normalize: bool | None = None
    priority: Priority = Field(default=None, description=f"Priority lane: {PRIORITY_RULE}.")


class ScoreRequest(_Request):
    """vLLM's /score: text_1 against each of text_2 (or pairwise when both are lists of equal length); vLLM's
    newer names for the two sides (queries with documents or items, data_1 with data_2) are read as them."""

    text_1: Annotated[TextOrTexts, PlainValidator(lambda v: score_side(v, "text_1"))]
    text_2: Annotated[TextOrTexts, PlainValidator(lambda v: score_side(v, "text_2"))]
    use_activation: bool | None = Field(default=None, description=f"vLLM's: false asks for raw scores, {RAW}")
    truncate: bool | None = None
    truncate_prompt_tokens: int | None = Field(default=None, description=TRUNCATE_PROMPT_TOKENS)
    truncation_side: Side = "right"
    instruction: str | None = Field(default=None, description=INSTRUCTION)
    scoring: Scoring | None = Field(default=None, description=SCORING)
    priority: Priority = Field(default=None, description=f"Priority lane: {PRIORITY_RULE}.")
    _names: tuple[str, str] = PrivateAttr(default=("text_1", "text_2"))  # the two sides' fields as sent

    @model_validator(mode="wrap")
    @classmethod
    def _sides(cls, data: Any, handler: Any) -> ScoreRequest:
        names = ("text_1", "text_2")
        if isinstance(data, dict):
            names, data = score_sides(data)
        request = handler(data)
        request._names = names
        return request

    @property
    def names(self) -> tuple[str, str]:
        return self._names


class RerankRequest(_Request):
    """Cohere's and Jina's rerank request."""

    query: Query
    documents: RerankDocuments
    top_n: Annotated[int, Field(ge=0)] | None = Field(default=None, description="Keep the best n; 0 (vLLM's "
                                                      "default) or omitted: every document.")
    return_documents: bool | None = Field(default=None, description="Echo each document as {\"text\"}; omitted: "
                                          "yes (vLLM and Jina return them), except at /v2/rerank (Cohere v2's).")
    raw_scores: bool | None = Field(default=None, description=f"Infinity's: true asks for raw scores, {RAW}")
    use_activation: bool | None = Field(default=None, description=f"vLLM's: false asks for raw scores, {RAW}")
    max_tokens_per_doc: Annotated[int, Field(ge=1)] | None = Field(default=None, description=MAX_TOKENS_PER_DOC)
    max_chunks_per_doc: Annotated[int, Field(ge=1)] | None = Field(default=None, description="Cohere v1's: a long "
                                                                 "document is not chunked here; above 1 with truncate "
                                                                 "it is refused (truncate cuts instead).")
    rank_fields: list[str] | None = Field(default=None, description='Cohere v1\'s: ["text"] only, the key scored.')
    truncate: bool | None = Field(default=None, description="Cut over-long inputs; omitted = the server default, "
                                  "except at /v2/rerank (Cohere v2 cuts every document: true).")
    truncate_prompt_tokens: int | None = Field(default=None, description=TRUNCATE_PROMPT_TOKENS)
    truncation_side: Side = "right"
    instruction: str | None = Field(default=None, description=INSTRUCTION)
    scoring: Scoring | None = Field(default=None, description=SCORING)
    priority: Priority = Field(default=None, description=f"Priority lane: {PRIORITY_RULE}.")


class TeiRerankRequest(_Request):
    """text-embeddings-inference's rerank request (POST /rerank with `texts`): answered as a list of
    {"index", "score", "text"?} by score, TEI's shape. Scores are the model's own (a cross-encoder's activation
    applied, or cosine); `raw_scores` asks for the logits before that activation. TEI's
    `truncate` (true: cut to the model's length) and `truncation_direction` (read as truncation_side) mean what
    they mean there; vLLM's truncate_prompt_tokens is taken too, since vLLM's clients post to the same path, and
    read as on /v1/rerank."""

    query: Query
    texts: Annotated[list[str], PlainValidator(lambda v: parse_texts(v, "texts")), WithJsonSchema(
        {"type": "array", "items": {"type": "string", "minLength": 1}})]
    raw_scores: bool = Field(default=False, description=f"true asks for raw scores, {RAW}")
    use_activation: bool | None = Field(default=None, description="vLLM's: false asks for raw scores, as raw_scores.")
    return_text: bool = False
    max_tokens_per_doc: Annotated[int, Field(ge=1)] | None = Field(default=None, description=MAX_TOKENS_PER_DOC)
    truncate: bool | None = None
    truncate_prompt_tokens: int | None = Field(default=None, description=TRUNCATE_PROMPT_TOKENS)
    truncation_side: Side = "right"
    priority: Priority = Field(default=None, description=f"Priority lane: {PRIORITY_RULE}.")


def rerank_schema(data: Any) -> type[RerankRequest] | type[TeiRerankRequest]:
    """POST /rerank's body: text-embeddings-inference's when it has `texts` and no `documents`, else Cohere's /
    Jina's (what vLLM and Infinity take there too)."""
    tei = isinstance(data, dict) and "texts" in data and "documents" not in data
    return TeiRerankRequest if tei else RerankRequest


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
    priority: Priority = Field(default=None, description=f"Priority lane: {PRIORITY_RULE}.")


class SparseEmbedRequest(_Request):
    """POST /embed_sparse (text-embeddings-inference's route): `inputs` as /embed takes them; `top_k` keeps each
    vector's k largest weights (0: every non-zero one; absent: the model's default)."""

    inputs: Annotated[Inputs, PlainValidator(lambda v: parse_inputs(v, "inputs")), WithJsonSchema({"anyOf": [
        {"type": "string"}, {"type": "array", "items": {"type": "string"}},
        {"type": "array", "items": {"type": "integer"}}, _ID_LISTS]})]
    top_k: int | None = Field(default=None, ge=0, le=1_000_000, description=(
        "Keep the k largest weights per input; 0 = every non-zero weight; omitted = the model's default: a SPLADE "
        "folder's max_active_dims (config_sentence_transformers.json) when it sets one, else every non-zero weight."))
    truncate: bool | None = None
    truncation_side: Side = "right"
    prompt_name: str | None = None
    priority: Priority = Field(default=None, description=f"Priority lane: {PRIORITY_RULE}.")


class MultiVectorEmbedRequest(_Request):
    """POST /embed_multi_vector: one L2-normalized vector per token of each input (BGE-M3 / ColBERT)."""

    inputs: Annotated[Inputs, PlainValidator(lambda v: parse_inputs(v, "inputs")), WithJsonSchema({"anyOf": [
        {"type": "string"}, {"type": "array", "items": {"type": "string"}},
        {"type": "array", "items": {"type": "integer"}}, _ID_LISTS]})]
    truncate: bool | None = None
    truncation_side: Side = "right"
    prompt_name: str | None = None
    priority: Priority = Field(default=None, description=f"Priority lane: {PRIORITY_RULE}.")


_PAIR = {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 2}


class PredictRequest(_Request):
    """text-embeddings-inference's POST /predict for a sequence classifier: a text, a pair [text, text_pair] (the
    tokenizer's pair encoding) or a batch [[text], [text, text_pair], ...]; per input every label's score, best
    first (one input: its list; a batch: a list per input)."""

    inputs: Annotated[PredictInputs, PlainValidator(parse_predict_inputs), WithJsonSchema(
        {"anyOf": [{"type": "string"}, _PAIR, {"type": "array", "items": _PAIR}]})]
    truncate: bool | None = Field(default=None, description="Cut over-long inputs; omitted = the server default.")
    truncation_side: Side = "right"
    raw_scores: bool = Field(default=False, description="The logits, not softmax (or the sigmoid of a multi-label "
                                                        "model).")
    priority: Priority = Field(default=None, description=f"Priority lane: {PRIORITY_RULE}.")


class ClassifyRequest(_Request):
    """vLLM's POST /classify: `input` texts (or token ids) as /v1/embeddings takes them; per input its label
    (the best) and every label's probability in label order."""

    input: EmbeddingInput
    truncate: bool | None = None
    truncate_prompt_tokens: int | None = Field(default=None, description="vLLM's: -1 cuts to the model's length, "
                                               "k keeps k tokens (a text's special tokens included).")
    truncation_side: Side = "right"
    use_activation: bool | None = Field(default=None, description="vLLM's: true or omitted: softmax (a multi-label "
                                                                  "model: sigmoid); false: the logits.")
    softmax: bool | None = Field(default=None, description="vLLM's older name of use_activation.")
    add_special_tokens: Literal[True] = Field(default=True, description="Texts are classified with the model's "
                                              "special tokens; send token ids as input for others.")
    priority: Priority = Field(default=None, description=f"Priority lane: {PRIORITY_RULE}.")

    @property
    def activated(self) -> bool:
        """use_activation, else its older name softmax, else on (vLLM's None)."""
        chosen = self.use_activation if self.use_activation is not None else self.softmax
        return chosen is not False


class SimilarityInputs(_Body):
    source_sentence: Annotated[str, PlainValidator(lambda v: one_text(v, "inputs.source_sentence")), WithJsonSchema({"type": "string", "minLength": 1})]
    sentences: Annotated[list[str], PlainValidator(lambda v: parse_texts(v, "inputs.sentences", reserved=1)), WithJsonSchema(
        {"type": "array", "items": {"type": "string", "minLength": 1}})]


class SimilarityParameters(_Body):
    peer_prefix: ClassVar[str] = "parameters."
    truncate: bool | None = None
    truncation_side: Side = "right"
    prompt_name: str | None = Field(default=None, description="A sentence-transformers prompt, applied to every text.")


class SimilarityRequest(_Request):
    """text-embeddings-inference's (and the Hugging Face sentence-similarity task's) POST /similarity: the
    cosine of the source sentence's embedding with each sentence's, answered as a list of floats."""

    inputs: SimilarityInputs
    parameters: SimilarityParameters | None = None
    priority: Priority = Field(default=None, description=f"Priority lane: {PRIORITY_RULE}.")
