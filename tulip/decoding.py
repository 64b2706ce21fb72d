"""The gRPC port's deserializers for Embed and EmbedStream (tulip.server registers them in place of the generated
ones): they never raise, since grpc would end the call UNKNOWN, the whole stream with it. A message that fails
to decode becomes a marker: an EmbedRequest whose string fields are not UTF-8 (request_id, output, flow) is parsed
again with those fields as bytes, so that its stream id is read and the field named, and is refused alone
(INVALID_ARGUMENT); a stream message whose id cannot be read ends the stream (tulip.stream)."""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

from protos import embed_pb2


class UndecodableRequest:
    """An EmbedRequest whose bytes failed to decode: TulipServer.admit refuses it INVALID_ARGUMENT with `problem`.
    `request_id` as sent, for the log line, its bytes that are not UTF-8 escaped."""

    __slots__ = ("problem", "request_id")

    def __init__(self, problem: str, request_id: str = "") -> None:
        self.problem = problem
        self.request_id = request_id


class UndecodableStreamRequest:
    """A StreamRequest whose bytes failed to decode. Its id, cancel and timeout_s as sent, where they could be read
    (only a string field of its request was not UTF-8): `request` is then an UndecodableRequest, refused on that
    id alone. `id` None: not even the id could be read, and the stream is ended (StreamRequests.handle)."""

    __slots__ = ("id", "cancel", "timeout_s", "request", "problem")

    def __init__(self, request_id: int | None, problem: str, cancel: bool = False, timeout_s: float = 0.0,
                 request: UndecodableRequest | None = None) -> None:
        self.id = request_id
        self.problem = problem
        self.cancel = cancel
        self.timeout_s = timeout_s
        self.request = request


def _lenient_classes() -> dict[str, type]:
    """embed.proto's messages with every string field read as bytes (a separate pool and package), which parse
    whatever the strict classes refuse only for a string field that is not UTF-8: its id is read, and the field
    named."""
    proto = descriptor_pb2.FileDescriptorProto.FromString(embed_pb2.DESCRIPTOR.serialized_pb)
    strict = proto.package
    proto.name = "tulip/lenient_embed.proto"
    proto.package = f"{strict}.lenient"
    proto.ClearField("service")
    for message in proto.message_type:
        for field in message.field:
            if field.type == field.TYPE_STRING:
                field.type = field.TYPE_BYTES
            if field.type_name.startswith(f".{strict}."):
                field.type_name = f".{proto.package}.{field.type_name[len(strict) + 2:]}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{proto.package}.{name}"))
            for name in ("EmbedRequest", "StreamRequest")}


_LENIENT = _lenient_classes()
_STRING_FIELDS = tuple(f.name for f in embed_pb2.EmbedRequest.DESCRIPTOR.fields if f.type == f.TYPE_STRING)


def _parse(cls, data: bytes):
    """(the message, None, None) where `cls` decodes `data`; else (None, its lenient twin's message or None when
    that fails too, the strict class's DecodeError)."""
    try:
        return cls.FromString(data), None, None
    except DecodeError as exc:
        try:
            return None, _LENIENT[cls.DESCRIPTOR.name].FromString(data), exc
        except DecodeError:
            return None, None, exc


def decode_embed_request(data: bytes) -> embed_pb2.EmbedRequest | UndecodableRequest:
    """Embed's request deserializer: an EmbedRequest, or the marker that admit refuses (a deserializer that raises
    ends the call UNKNOWN, "Unexpected DecodeError", before Tulip sees it)."""
    message, lenient, exc = _parse(embed_pb2.EmbedRequest, data)
    if exc is None:
        return message
    if lenient is None:
        return UndecodableRequest(f"the request could not be decoded as an EmbedRequest: {exc}")
    return _undecodable(lenient, exc)


def decode_stream_request(data: bytes) -> embed_pb2.StreamRequest | UndecodableStreamRequest:
    """EmbedStream's request deserializer: a StreamRequest, or the marker StreamRequests.handle answers (the one
    request refused when its id could be read, else the stream ended), rather than the whole call ending UNKNOWN
    with every other request on it unanswered."""
    message, lenient, exc = _parse(embed_pb2.StreamRequest, data)
    if exc is None:
        return message
    if lenient is None:
        return UndecodableStreamRequest(None, f"a message could not be decoded as a StreamRequest ({exc}), so the "
                                              "request it carried cannot be answered: the stream is ended")
    return UndecodableStreamRequest(lenient.id, "", cancel=lenient.cancel, timeout_s=lenient.timeout_s,
                                    request=_undecodable(lenient.request, exc))


def _undecodable(lenient, exc: DecodeError) -> UndecodableRequest:
    """The marker for an EmbedRequest the lenient class read: the string fields that are not UTF-8, named."""
    bad = []
    for name in _STRING_FIELDS:
        try:
            getattr(lenient, name).decode("utf-8")
        except UnicodeDecodeError:
            bad.append(name)
    request_id = lenient.request_id.decode("utf-8", "backslashreplace")
    if not bad:  # not expected: the lenient class differs only in not checking UTF-8
        return UndecodableRequest(f"the request could not be decoded as an EmbedRequest: {exc}", request_id)
    return UndecodableRequest(f"{' and '.join(bad)} {'is' if len(bad) == 1 else 'are'} not valid UTF-8: protobuf "
                              "string fields must be", request_id)
