"""Tulip's gRPC Embedder servicer: the RPCs (Embed, EmbedStream, Info) as thin adapters over a TulipServer.

Admission, drain bookkeeping and metrics are the server's (TulipServer.admit / settled / rejected), so a
unary call and a streamed request (tulip.stream) are admitted the same way; this module only awaits the
job, maps a TulipError to its gRPC status and builds the Info reply; add_embedder registers it with tulip.decoding's
deserializers.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import grpc

from protos import embed_pb2, embed_pb2_grpc
from tulip import framed
from tulip.decoding import decode_embed_request, decode_stream_request
from tulip.errors import TulipError, error_metadata
from tulip.stream import EmbedStreamSession
from tulip.version import __version__

if TYPE_CHECKING:
    from tulip.server import TulipServer

SERVICE_NAME = embed_pb2.DESCRIPTOR.services_by_name["Embedder"].full_name  # "tulip.v1.Embedder"


class TulipEmbedderServicer(embed_pb2_grpc.EmbedderServicer):
    def __init__(self, server: TulipServer) -> None:
        self._server = server

    async def Embed(self, request: embed_pb2.EmbedRequest, context: grpc.aio.ServicerContext):
        server = self._server
        started = time.perf_counter()
        status, tokens, job = "OK", 0, None
        try:
            job = server.admit(request, context.time_remaining(), started)
            try:
                result = await job.future
            except asyncio.CancelledError:  # client cancelled or its deadline passed: drop queued work
                server.queue.cancel(job)
                expired = job.deadline is not None and time.monotonic() >= job.deadline
                status = "DEADLINE_EXCEEDED" if expired else "CANCELLED"
                raise
            tokens = result.tokens
            return result.proto()
        except TulipError as exc:
            status = exc.status
            server.rejected(request.request_id, exc)
            await context.abort(grpc.StatusCode[exc.status], exc.message, trailing_metadata=error_metadata(exc))
        finally:
            server.settled(job, status, started, tokens)

    async def EmbedStream(self, request_iterator, context: grpc.aio.ServicerContext) -> None:
        # The framed port's marks (read per call: the tests lower them): one limit on unread answers, either port.
        await EmbedStreamSession(self._server, context, framed.WRITE_HIGH_BYTES, framed.STALL_S).run(request_iterator)

    async def Info(self, request: embed_pb2.InfoRequest, context: grpc.aio.ServicerContext):
        server = self._server
        if server.engine is None or server.limits is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the model is still loading")
        info = server.engine.info
        return embed_pb2.InfoResponse(
            model_id=server.model_id, family=info.family, max_length=int(info.max_length),
            dimensions=int(info.dimensions), pooling=info.pooling,
            tokenizer_fingerprint=info.tokenizer_fingerprint,
            native_dtype="int8" if info.native_int8 else "float32", normalized=bool(info.normalize_default),
            max_batch_tokens=server.batch_tokens, max_batch_seqs=server.config.max_batch_seqs,
            attention_backend=str(getattr(info, "attention_backend", "")), device=str(info.device),
            version=__version__, tasks=list(getattr(info, "tasks", ("embed",))), framed_port=server.framed.port,
            outputs=[o.name for o in server.limits.outputs])


def add_embedder(servicer: TulipEmbedderServicer, server: grpc.aio.Server) -> None:
    """embed_pb2_grpc.add_EmbedderServicer_to_server, but Embed's and EmbedStream's requests decoded by
    tulip.decoding's deserializers: a message that fails to decode (a string field not UTF-8) is then answered
    INVALID_ARGUMENT by Tulip, where the generated FromString raised and grpc ended the call UNKNOWN (on a
    stream, with every other request on it unanswered)."""
    handlers = {
        "Embed": grpc.unary_unary_rpc_method_handler(
            servicer.Embed, request_deserializer=decode_embed_request,
            response_serializer=embed_pb2.EmbedResponse.SerializeToString),
        "EmbedStream": grpc.stream_stream_rpc_method_handler(
            servicer.EmbedStream, request_deserializer=decode_stream_request,
            response_serializer=embed_pb2.StreamResponse.SerializeToString),
        "Info": grpc.unary_unary_rpc_method_handler(
            servicer.Info, request_deserializer=embed_pb2.InfoRequest.FromString,
            response_serializer=embed_pb2.InfoResponse.SerializeToString),
    }
    assert set(handlers) == set(embed_pb2.DESCRIPTOR.services_by_name["Embedder"].methods_by_name)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)
