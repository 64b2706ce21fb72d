"""Concurrent small requests share one gRPC call to a replica.

Why: under concurrency Tulip's cost is per call, not per token (one gRPC round, one Job, one event-loop
hand-off each: ~0.3-0.5 ms of Tulip CPU per call on the 2-core VM, ~2.4x that on the H200 host), and its
single event loop then caps a replica's request rate long before the GPU is busy. Tulip batches whatever
reaches it, so merging requests that are ready at the same moment costs the GPU nothing.

How, without a timer: the gateway sends a request straight out when nothing of its process is waiting
on a replica (alone, it pays nothing). Otherwise a request that fits in one chunk joins the open group for
its output options (dimensions, normalize, encoding) and priority lane (never across lanes); the first one in a group schedules the send with
`call_soon`, so the group closes after the event loop has run every callback that was already ready (the
other requests parsed in the same turn). Under load a turn holds many ready requests and the groups grow
by themselves. A group is also sent as soon as it is full (chunk token or sequence budget).

Only while some replica is on its gRPC stream (or unary calls): over the framed EmbedStream a call costs Tulip a
fifth of a gRPC one, and on the H200 sharing calls there cost 8 % of the requests at 16 clients (Ivy's own time a
request 0.8-1.0 ms against 1.5-1.7 with groups; benchmarks/NOTES.md, "Coalescing"), so the gateway sends each
request on its own when every serving replica is framed (ReplicaPool.all_framed).

Each caller waits for its own rows until its own deadline; the group's call carries the latest deadline
of its members. A caller that goes away leaves the group; the call is cancelled only when every member
has gone (then its work is dropped before batching, as for a single request).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ivy import metrics, request_trace
from ivy.encode import checked_rows, embed_request
from ivy.errors import IvyError, Problem
from protos import embed_pb2
from rose.head import Encoding

Call = Callable[[embed_pb2.EmbedRequest, int, float], Awaitable[embed_pb2.EmbedResponse]]
OptionsKey = tuple[int, "bool | None", int, int]  # dimensions, normalize, encoding, lane


@dataclass
class _Member:
    sequences: Sequence[Sequence[int]]
    tokens: int
    deadline: float
    request_id: str
    future: asyncio.Future
    # the shared call's (its cold flag and timings: request_trace.note_backend)
    response: embed_pb2.EmbedResponse | None = None


@dataclass
class _Group:
    key: OptionsKey
    members: list[_Member] = field(default_factory=list)
    tokens: int = 0
    seqs: int = 0
    task: asyncio.Task | None = None


class Coalescer:
    def __init__(self, call: Call, max_tokens: int, max_seqs: int) -> None:
        self._call = call
        self._max_tokens = max_tokens
        self._max_seqs = max_seqs
        self._open: dict[OptionsKey, _Group] = {}

    def has_open_group(self) -> bool:
        return bool(self._open)

    async def embed(self, sequences: Sequence[Sequence[int]], tokens: int, *, deadline: float, dimensions: int,
                    normalize: bool | None, encoding: Encoding, request_id: str, lane: int = 0) -> np.ndarray:
        """Rows for `sequences` (one per sequence), computed in a call shared with concurrent requests."""
        if deadline <= time.monotonic():  # never send work that is already late
            raise IvyError(Problem.DEADLINE_EXCEEDED, "the request did not finish within its deadline")
        key = (dimensions, normalize, int(encoding), int(lane))
        group = self._open.get(key)
        if group is not None and (group.tokens + tokens > self._max_tokens or
                                  group.seqs + len(sequences) > self._max_seqs):
            self._send(group)
            group = None
        if group is None:
            group = self._open[key] = _Group(key)
            asyncio.get_running_loop().call_soon(self._send, group)
        member = _Member(sequences, tokens, deadline, request_id, asyncio.get_running_loop().create_future())
        group.members.append(member)
        group.tokens += tokens
        group.seqs += len(sequences)
        try:
            # asyncio.timeout, not wait_for: on 3.11 wait_for lost a cancel that landed as the future resolved
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                rows = await asyncio.shield(member.future)
            if member.response is not None:
                request_trace.note_backend(member.response)
            return rows
        except TimeoutError:
            raise IvyError(Problem.DEADLINE_EXCEEDED, "the request did not finish within its deadline") from None
        finally:
            if not member.future.done():  # cancelled or timed out: leave the group
                member.future.cancel()
                if group.task is not None and all(m.future.done() for m in group.members):
                    group.task.cancel()

    def _send(self, group: _Group) -> None:
        if self._open.get(group.key) is group:
            del self._open[group.key]
        if group.task is not None:
            return
        live = [m for m in group.members if not m.future.done()]
        if not live:
            return
        group.members = live  # a member that left before the send is not sent
        group.tokens = sum(m.tokens for m in live)
        group.seqs = sum(len(m.sequences) for m in live)
        group.task = asyncio.ensure_future(self._run(group))

    async def _run(self, group: _Group) -> None:
        members = group.members
        seqs = [s for m in members for s in m.sequences]
        try:  # everything inside: a failure anywhere must reach every member, never leave one waiting
            metrics.COALESCED.observe(len(members))
            response = await self._call(self._request(group, seqs), group.tokens, max(m.deadline for m in members))
            rows = checked_rows(response, len(seqs))
            for m in members:
                m.response = response
        except IvyError as exc:
            if exc.problem is Problem.INVALID_PARAMETER and len(members) > 1:
                await self._one_by_one(group)  # one member's input: the others must not get its error
                return
            self._fail(members, exc)
            return
        except asyncio.CancelledError:
            for m in members:
                if not m.future.done():
                    m.future.cancel()
            raise
        except Exception as exc:  # noqa: BLE001 - every member gets the same failure
            self._fail(members, exc)
            return
        at = 0
        for m in members:
            n = len(m.sequences)
            if not m.future.done():
                m.future.set_result(rows[at:at + n])
            at += n

    @staticmethod
    def _request(group: _Group, seqs: list) -> embed_pb2.EmbedRequest:
        dimensions, normalize, encoding, *rest = group.key  # a key without a lane (older callers): interactive
        lane = rest[0] if rest else 0
        rid = ""
        for m in group.members:  # whole ids only, at most 256 characters (a log field in Tulip)
            if len(rid) + len(m.request_id) + 1 > 256:
                break
            rid = f"{rid},{m.request_id}" if rid else m.request_id
        return embed_request(seqs, group.tokens, dimensions=dimensions, normalize=normalize, encoding=encoding,
                             request_id=rid, lane=lane)

    async def _one_by_one(self, group: _Group) -> None:
        """The replica rejected the shared call's input: send each member alone, so each gets its own answer."""
        async def alone(m: _Member) -> None:
            single = _Group(group.key, [m], tokens=m.tokens, seqs=len(m.sequences))
            await self._run(single)

        await asyncio.gather(*(alone(m) for m in group.members if not m.future.done()))

    @staticmethod
    def _fail(members: list[_Member], exc: BaseException) -> None:
        for m in members:
            if not m.future.done():
                m.future.set_exception(exc)
