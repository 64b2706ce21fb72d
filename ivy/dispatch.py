"""One chunk to a replica and back: which replica, what a failure means, when to try another.

`send(pool, request, tokens, deadline)` (what ReplicaPool.call runs) sends the chunk to the SERVING
replica with the fewest outstanding tokens and, while the request's deadline allows:
- UNAVAILABLE or CANCELLED (the replica went away, drains, or its watchdog says it is stalled): the replica
  is marked UNREACHABLE until its next probe and the chunk goes to another one (RELIABILITY 17);
- no answer within the attempt timeout (`attempt_timeout_s`, IVY_REPLICA_TIMEOUT_S) while another replica
  is shown to answer (SERVING, not tried, and idle or answered something since this attempt began; a
  queue-full answer does not count) and the deadline is further away (RELIABILITY 28: a hung replica,
  SIGSTOP or a stuck GPU, keeps its connection and may still answer health SERVING): the replica is
  ejected (UNREACHABLE until a probe answers, its stream closed so every chunk in flight on it fails over
  now; Tulip drops the work of a closed stream, and a cancelled request is cancelled on it) and the chunk
  is re-sent elsewhere. With no such replica the attempt goes on and is looked at again after another
  attempt timeout: a stall of the whole host (every replica late at once) must not eject every replica
  and fail the chunk. The replica is always given the request's own deadline; the attempt timeout is
  Ivy's alone;
- REPLICA_BUSY (the replica's queue is full, RESOURCE_EXHAUSTED): another replica now; when every one is
  busy, a pause (jittered, doubling from BUSY_PAUSE_S[0] to [1]) and again on any of them, until the
  deadline leaves no room for another pause and an attempt of MIN_ATTEMPT_S after it (RELIABILITY 31: a
  request larger than the free queues waits for room instead of a 429 while nothing else is queued). Then
  the 429 is the answer (also when a pause, or the last retry itself, overran the deadline on a loaded host);
- a chunk for an output the replica's Info does not name (a reranker's `logit`) goes only to replicas that name
  it or name none; one that names none and refuses it as unknown (an older Tulip, INVALID_ARGUMENT) is not sent
  that output again until its next Info, and the chunk goes elsewhere; with no such replica left, a 503 that
  says why (RELIABILITY 60);
- any other error is the answer.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import TYPE_CHECKING

import grpc

from ivy import metrics
from ivy.errors import IvyError, Problem, from_grpc
from ivy.stream import CallFailed
from protos import embed_pb2

if TYPE_CHECKING:
    from ivy.replicas import Replica, ReplicaPool

log = logging.getLogger("ivy.replicas")

_GONE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
# Failures that do not show the replica can take a chunk: no answer from it, or its queue full.
_NO_ROOM = (*_GONE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED)
LATE_LOOK_S = 0.05  # a look this late was held by the loop: it looks again once pending answers are read
# Pauses while every replica's queue is full: the first about one batch on a GPU (a full Tulip queue drains
# in ~1 s there), then doubling up to about one batch on a CPU replica (~1.5 s).
BUSY_PAUSE_S = (0.02, 1.0)
MIN_ATTEMPT_S = 0.05  # after a busy pause, at least this much of the deadline must be left to try again


async def send(pool: ReplicaPool, request: embed_pb2.EmbedRequest, tokens: int,
               deadline: float) -> embed_pb2.EmbedResponse:
    tried: set[Replica] = set()  # failed or timed out: not again for this chunk
    busy: set[Replica] = set()  # queue full: again after a pause
    pause = BUSY_PAUSE_S[0]
    last: IvyError | None = None
    response_bytes = _rows(request) * (request.dimensions or pool.expected.dimensions) * 4 + 64
    while True:
        replica = pool.pick(tried | busy, request.output)
        if replica is None and busy:
            wait = pause * random.uniform(0.5, 1.5)
            if deadline - time.monotonic() <= wait + MIN_ATTEMPT_S:
                raise last  # type: ignore[misc]  # REPLICA_BUSY: the last replica tried answered queue full
            await asyncio.sleep(wait)
            pause = min(2 * pause, BUSY_PAUSE_S[1])
            busy.clear()
            continue
        if replica is None:
            if last is None and request.output and pool.any_serving():
                raise IvyError(Problem.UNAVAILABLE, f"no replica serving now answers output {request.output!r} "
                               "(a reranker's logit, for raw scores and /predict): they run an older Tulip; retry "
                               "once the rollout is done")
            raise last or IvyError(Problem.UNAVAILABLE, "no model replica is available; retry later")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            if last is not None and last.problem is Problem.REPLICA_BUSY:
                raise last  # the pause overran a loaded host's clock: the queue being full is still the answer
            raise IvyError(Problem.DEADLINE_EXCEEDED, "the request did not finish within its deadline")
        replica.outstanding_tokens += tokens
        replica.m_outstanding.inc(tokens)
        replica.m_chunks.inc()
        start = time.perf_counter()
        try:
            return await _attempt(pool, replica, tried, request, remaining, response_bytes)
        except _Overdue as late:
            waited = late.args[0]
            log.warning("replica %s did not answer a chunk of %d tokens in %.1f s while another replica "
                        "answers: ejected until its next probe; re-sending the chunk elsewhere",
                        replica.address, tokens, waited)
            replica.eject(f"no answer within {pool.attempt_timeout_s:g} s")
            reason = "TIMEOUT"
            error = IvyError(Problem.DEADLINE_EXCEEDED, "the request did not finish within its deadline")
        except CallFailed as exc:
            code = exc.code
            error = from_grpc(code, exc.details, replica.address, exc.reason, exc.retry_after_s)
            if code in _GONE:
                replica.mark_down(f"Embed failed: {code.name}")
                reason = code.name
            elif error.problem is Problem.REPLICA_BUSY:
                metrics.RETRIES.labels(code.name).inc()
                busy.add(replica)
                last = error
                continue  # (finally runs first) not a failure of the replica: no warning per chunk
            elif (code == grpc.StatusCode.INVALID_ARGUMENT and request.output and not replica.outputs
                  and exc.details.startswith(f"output = {request.output!r}")):
                log.info("replica %s does not serve output %r (an older Tulip): not sent there until its next Info",
                         replica.address, request.output)
                replica.lacks.add(request.output)  # pick skips it for this output now: the chunk goes elsewhere
                continue
            elif code == grpc.StatusCode.DEADLINE_EXCEEDED and last is not None \
                    and last.problem is Problem.REPLICA_BUSY:
                raise last from None  # a retry after queue full ran out of deadline (a stalled host): still the 429
            else:
                raise error from None
        finally:
            replica.outstanding_tokens -= tokens
            replica.m_outstanding.dec(tokens)
            replica.m_grpc_seconds.observe(time.perf_counter() - start)
        log.warning("chunk of %d tokens failed on %s with %s; trying another replica", tokens, replica.address, reason)
        metrics.RETRIES.labels(reason).inc()
        tried.add(replica)
        last = error


class _Overdue(Exception):
    """The attempt outlived the attempt timeout while another replica answers (it was cancelled); its
    argument: how long it ran."""


async def _attempt(pool: ReplicaPool, replica: Replica, tried: set[Replica], request: embed_pb2.EmbedRequest,
                   remaining: float, response_bytes: int) -> embed_pb2.EmbedResponse:
    """The replica's answer within `remaining` seconds (the call's own timeout), or _Overdue once it is
    `pool.attempt_timeout_s` late while another replica is shown to answer. Raises CallFailed.
    The call runs inline; a timer looks at it every attempt timeout and cancels this task to give it up
    (as asyncio.timeout does): no task or wait per chunk on the hot path. The give-up runs one loop turn
    after the look, so an answer already in hand is returned, not lost; a look that fires late (the loop
    itself was held: a stalled host) looks once more after the answers that waited meanwhile are read."""
    began = time.monotonic()
    token = object()
    replica.attempts[token] = began
    limit = pool.attempt_timeout_s
    task = asyncio.current_task()
    cancelling = task.cancelling()  # a caller's cancellations already pending are not ours to take back
    loop = asyncio.get_running_loop()
    overdue = False
    timer: asyncio.Handle | None = None
    planned = loop.time() + limit

    def look(again: bool = False) -> None:
        nonlocal timer, planned
        now = loop.time()
        if not again and now - planned > LATE_LOOK_S:
            planned = now + LATE_LOOK_S
            timer = loop.call_at(planned, look, True)
        elif pool.answering_other(tried, replica, since=began, output=request.output):
            timer = loop.call_soon(give_up)
        elif time.monotonic() + limit < began + remaining:
            planned = now + limit
            timer = loop.call_at(planned, look)  # nowhere better to go yet: look again later

    def give_up() -> None:
        nonlocal overdue
        overdue = True
        task.cancel()  # the call's own cancellation tells the replica to drop the work

    if 0 < limit < remaining:
        timer = loop.call_at(planned, look)
    try:
        response = await replica.embed(request, remaining, response_bytes)
    except asyncio.CancelledError:
        if overdue and task.uncancel() <= cancelling:  # ours alone; a caller's cancellation goes on up
            raise _Overdue(time.monotonic() - began) from None
        raise
    except CallFailed as exc:
        if exc.code not in _NO_ROOM:
            replica.last_answer = time.monotonic()  # it answered, if not with rows
        raise
    finally:
        if timer is not None:
            timer.cancel()
        del replica.attempts[token]
    replica.last_answer = time.monotonic()
    return response


def _rows(request: embed_pb2.EmbedRequest) -> int:
    """Output rows of a request: one per span when spans are given, else one per sequence."""
    return len(request.spans) // 12 if request.spans else len(request.seq_lens) // 4
