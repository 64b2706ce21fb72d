from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Encoding(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENCODING_FLOAT32: _ClassVar[Encoding]
    ENCODING_INT8: _ClassVar[Encoding]
    ENCODING_BINARY: _ClassVar[Encoding]

class Lane(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LANE_INTERACTIVE: _ClassVar[Lane]
    LANE_BULK: _ClassVar[Lane]
ENCODING_FLOAT32: Encoding
ENCODING_INT8: Encoding
ENCODING_BINARY: Encoding
LANE_INTERACTIVE: Lane
LANE_BULK: Lane

class EmbedRequest(_message.Message):
    __slots__ = ("token_ids", "seq_lens", "spans", "dimensions", "normalize", "encoding", "request_id", "lane", "token_types", "output", "flow")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SEQ_LENS_FIELD_NUMBER: _ClassVar[int]
    SPANS_FIELD_NUMBER: _ClassVar[int]
    DIMENSIONS_FIELD_NUMBER: _ClassVar[int]
    NORMALIZE_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    LANE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_TYPES_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    FLOW_FIELD_NUMBER: _ClassVar[int]
    token_ids: bytes
    seq_lens: bytes
    spans: bytes
    dimensions: int
    normalize: bool
    encoding: Encoding
    request_id: str
    lane: Lane
    token_types: bytes
    output: str
    flow: str
    def __init__(self, token_ids: _Optional[bytes] = ..., seq_lens: _Optional[bytes] = ..., spans: _Optional[bytes] = ..., dimensions: _Optional[int] = ..., normalize: _Optional[bool] = ..., encoding: _Optional[_Union[Encoding, str]] = ..., request_id: _Optional[str] = ..., lane: _Optional[_Union[Lane, str]] = ..., token_types: _Optional[bytes] = ..., output: _Optional[str] = ..., flow: _Optional[str] = ...) -> None: ...

class EmbedResponse(_message.Message):
    __slots__ = ("embeddings", "rows", "dimensions", "encoding", "tokens", "cold", "queue_us", "inference_us", "batcher_us")
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    DIMENSIONS_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    COLD_FIELD_NUMBER: _ClassVar[int]
    QUEUE_US_FIELD_NUMBER: _ClassVar[int]
    INFERENCE_US_FIELD_NUMBER: _ClassVar[int]
    BATCHER_US_FIELD_NUMBER: _ClassVar[int]
    embeddings: bytes
    rows: int
    dimensions: int
    encoding: Encoding
    tokens: int
    cold: bool
    queue_us: int
    inference_us: int
    batcher_us: int
    def __init__(self, embeddings: _Optional[bytes] = ..., rows: _Optional[int] = ..., dimensions: _Optional[int] = ..., encoding: _Optional[_Union[Encoding, str]] = ..., tokens: _Optional[int] = ..., cold: _Optional[bool] = ..., queue_us: _Optional[int] = ..., inference_us: _Optional[int] = ..., batcher_us: _Optional[int] = ...) -> None: ...

class StreamRequest(_message.Message):
    __slots__ = ("id", "request", "timeout_s", "cancel")
    ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    id: int
    request: EmbedRequest
    timeout_s: float
    cancel: bool
    def __init__(self, id: _Optional[int] = ..., request: _Optional[_Union[EmbedRequest, _Mapping]] = ..., timeout_s: _Optional[float] = ..., cancel: _Optional[bool] = ...) -> None: ...

class StreamResponse(_message.Message):
    __slots__ = ("id", "response", "code", "message", "reason", "retry_after_s")
    ID_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_S_FIELD_NUMBER: _ClassVar[int]
    id: int
    response: EmbedResponse
    code: int
    message: str
    reason: str
    retry_after_s: float
    def __init__(self, id: _Optional[int] = ..., response: _Optional[_Union[EmbedResponse, _Mapping]] = ..., code: _Optional[int] = ..., message: _Optional[str] = ..., reason: _Optional[str] = ..., retry_after_s: _Optional[float] = ...) -> None: ...

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InfoResponse(_message.Message):
    __slots__ = ("model_id", "family", "max_length", "dimensions", "pooling", "tokenizer_fingerprint", "native_dtype", "normalized", "max_batch_tokens", "max_batch_seqs", "attention_backend", "device", "version", "tasks", "framed_port", "outputs")
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    MAX_LENGTH_FIELD_NUMBER: _ClassVar[int]
    DIMENSIONS_FIELD_NUMBER: _ClassVar[int]
    POOLING_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    NATIVE_DTYPE_FIELD_NUMBER: _ClassVar[int]
    NORMALIZED_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_SEQS_FIELD_NUMBER: _ClassVar[int]
    ATTENTION_BACKEND_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    FRAMED_PORT_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    model_id: str
    family: str
    max_length: int
    dimensions: int
    pooling: str
    tokenizer_fingerprint: str
    native_dtype: str
    normalized: bool
    max_batch_tokens: int
    max_batch_seqs: int
    attention_backend: str
    device: str
    version: str
    tasks: _containers.RepeatedScalarFieldContainer[str]
    framed_port: int
    outputs: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, model_id: _Optional[str] = ..., family: _Optional[str] = ..., max_length: _Optional[int] = ..., dimensions: _Optional[int] = ..., pooling: _Optional[str] = ..., tokenizer_fingerprint: _Optional[str] = ..., native_dtype: _Optional[str] = ..., normalized: _Optional[bool] = ..., max_batch_tokens: _Optional[int] = ..., max_batch_seqs: _Optional[int] = ..., attention_backend: _Optional[str] = ..., device: _Optional[str] = ..., version: _Optional[str] = ..., tasks: _Optional[_Iterable[str]] = ..., framed_port: _Optional[int] = ..., outputs: _Optional[_Iterable[str]] = ...) -> None: ...
