"""The completer settles a whole batch with one event-loop wake-up (tulip.job.Handoff)."""

from __future__ import annotations

import asyncio
import threading

from tulip.job import Handoff


class _Job:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.future = loop.create_future()


def test_one_wake_up_per_batch_and_every_future_settled() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        wakeups = 0
        real = loop.call_soon_threadsafe

        def counting(*args, **kwargs):
            nonlocal wakeups
            wakeups += 1
            return real(*args, **kwargs)

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
        jobs = [_Job(loop) for _ in range(16)]
        error = RuntimeError("engine failed")

        def completer() -> None:
            handoff = Handoff()
            for i, job in enumerate(jobs):
                handoff.add(job, None if i == 3 else i, error if i == 3 else None)
            handoff.flush()

        thread = threading.Thread(target=completer)
        thread.start()
        results = await asyncio.gather(*(j.future for j in jobs), return_exceptions=True)
        thread.join()
        assert wakeups == 1
        assert results[3] is error
        assert [r for i, r in enumerate(results) if i != 3] == [i for i in range(16) if i != 3]

    asyncio.run(main())


def test_a_cancelled_future_is_skipped() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        done, gone = _Job(loop), _Job(loop)
        gone.future.cancel()
        handoff = Handoff()
        handoff.add(gone, 1, None)
        handoff.add(done, 2, None)
        handoff.flush()
        assert await done.future == 2

    asyncio.run(main())
