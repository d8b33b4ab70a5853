"""The listener's idle watch (rlm/kafka/idle_watch.py): which waits it times and when it closes.
The listener's own behaviour (half-open clients, clients that stop reading) is tested end to end
in tests/kafka/test_protocol.py."""

from __future__ import annotations

import asyncio

from rlm.kafka.idle_watch import IdleWatch, Owing, tick_s


def test_only_connections_owing_bytes_for_the_whole_timeout_expire() -> None:
    watch = IdleWatch(10.0)
    silent, recent, answering = Owing(None), Owing(None), Owing(None)
    for owing in (silent, recent, answering):
        watch.add(owing)
    silent.since, recent.since, answering.since = 100.0, 105.0, None
    assert watch.check(109.9) == 0
    assert watch.check(110.0) == 1
    assert (silent.expired, recent.expired, answering.expired) == (True, False, False)
    assert watch.check(110.5) == 0  # expired once, counted once
    recent.since = 112.0  # progress (a frame's size header): the timeout starts again
    assert watch.check(116.0) == 0 and not recent.expired
    watch.discard(recent)  # a closed connection is no longer looked at
    assert watch.check(1000.0) == 0


def test_the_watch_cancels_the_silent_connections_task_only() -> None:
    async def scenario() -> tuple[bool, bool]:
        watch = IdleWatch(0.2)
        silent_task = asyncio.create_task(asyncio.sleep(30))
        busy_task = asyncio.create_task(asyncio.sleep(0.6))
        silent, busy = Owing(silent_task), Owing(busy_task)
        silent.since = asyncio.get_running_loop().time()  # waits for the client
        busy.since = None  # answering a request: never idle however long it takes
        watch.add(silent)
        watch.add(busy)
        runner = asyncio.create_task(watch.run())
        await asyncio.sleep(0.5)
        runner.cancel()
        await busy_task
        return silent_task.cancelled(), silent.expired and not busy.expired

    assert asyncio.run(scenario()) == (True, True)


def test_tick_is_a_quarter_of_the_timeout_and_at_most_a_second() -> None:
    assert tick_s(1.0) == 0.25
    assert tick_s(600.0) == 1.0
