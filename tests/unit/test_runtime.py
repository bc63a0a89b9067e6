"""Invariants of the asyncio actor runtime (actors/runtime.py)."""

from __future__ import annotations

import asyncio
import threading

import pykka
import pytest

from actors.runtime import AsyncioActor, AsyncioFuture, stop_all


class Recorder(AsyncioActor):
    """Records handler entry/exit so tests can see interleaving."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[str] = []
        self.total = 0
        self.running = 0

    async def slow_add(self, x: int, delay: float) -> int:
        self.running += 1
        assert self.running == 1, "two messages handled at once"
        self.log.append(f"start {x}")
        await asyncio.sleep(delay)
        self.total += x
        self.log.append(f"end {x}")
        self.running -= 1
        return self.total

    def add(self, x: int) -> int:
        self.total += x
        return self.total

    def fail(self) -> None:
        raise ValueError("boom")

    async def fail_async(self) -> None:
        await asyncio.sleep(0)
        raise KeyError("async boom")

    def on_receive(self, message: dict) -> int:
        return message["x"] * 10


class Hooks(AsyncioActor):
    """Reports its lifecycle hooks into a shared list; sync or async per flag."""

    def __init__(self, events: list[str], *, use_async: bool) -> None:
        super().__init__()
        self.events = events
        self.use_async = use_async

    def _record(self, name: str):
        if not self.use_async:
            self.events.append(name)
            return None

        async def record() -> None:
            await asyncio.sleep(0)
            self.events.append(name)

        return record()

    def on_start(self):
        return self._record("start")

    def on_stop(self):
        return self._record("stop")

    def on_failure(self, exc_type, exc_value, traceback):
        return self._record(f"failure {exc_type.__name__}")

    def crash(self) -> None:
        raise RuntimeError("crash")


@pytest.fixture
async def recorder():
    ref = Recorder.start()
    yield ref
    await ref.stop(block=False)


async def test_messages_are_handled_in_order_one_at_a_time_even_when_async(recorder):
    # Later messages are shorter, so any concurrency would reorder the log.
    futures = [recorder.proxy().slow_add(x, 0.03 - x * 0.01) for x in range(3)]
    assert await asyncio.gather(*futures) == [0, 1, 3]
    assert await recorder.proxy().log == [
        "start 0", "end 0", "start 1", "end 1", "start 2", "end 2",
    ]


async def test_ask_returns_the_handler_value(recorder):
    assert await recorder.ask({"x": 4}, block=False) == 40


async def test_ask_raises_the_handler_exception_and_actor_keeps_running(recorder):
    with pytest.raises(ValueError, match="boom"):
        await recorder.proxy().fail()
    with pytest.raises(KeyError, match="async boom"):
        await recorder.proxy().fail_async()
    assert recorder.is_alive()
    assert await recorder.proxy().add(2) == 2


@pytest.mark.parametrize("use_async", [False, True])
async def test_tell_failure_calls_on_failure_and_stops_the_actor(use_async):
    events: list[str] = []
    ref = Hooks.start(events, use_async=use_async)
    ref.tell(pykka.messages.ProxyCall(attr_path=("crash",), args=(), kwargs={}))
    later = ref.ask({"never": "handled"}, block=False)
    with pytest.raises(pykka.ActorDeadError):
        await later
    assert events == ["start", "failure RuntimeError"]  # on_stop is not called
    assert not ref.is_alive()
    assert pykka.ActorRegistry.get_by_urn(ref.actor_urn) is None


@pytest.mark.parametrize("use_async", [False, True])
async def test_on_start_and_on_stop_run(use_async):
    events: list[str] = []
    ref = Hooks.start(events, use_async=use_async)
    await ref.ask({"sync": "point"}, block=False)  # on_start ran before any message
    assert events == ["start"]
    assert await ref.stop(block=False) is True
    assert events == ["start", "stop"]


async def test_stop_of_a_dead_actor_returns_false(recorder):
    assert await recorder.stop(block=False) is True
    assert await recorder.stop(block=False) is False


async def test_asks_pending_at_stop_get_actor_dead_error(recorder):
    slow = recorder.proxy().slow_add(1, 0.02)
    stopping = recorder.stop(block=False)
    queued_after_stop = recorder.proxy().add(5)  # sent before the stop is handled
    assert await slow == 1
    assert await stopping is True
    with pytest.raises(pykka.ActorDeadError):
        await queued_after_stop
    with pytest.raises(pykka.ActorDeadError):
        await recorder.ask({"x": 1}, block=False)  # sent after it stopped


async def test_registry_finds_running_actors_and_forgets_stopped_ones(recorder):
    assert recorder in pykka.ActorRegistry.get_by_class(Recorder)
    assert recorder in pykka.ActorRegistry.get_by_class(AsyncioActor)
    assert pykka.ActorRegistry.get_by_urn(recorder.actor_urn) is recorder
    await recorder.stop(block=False)
    assert recorder not in pykka.ActorRegistry.get_by_class(Recorder)
    assert pykka.ActorRegistry.get_by_urn(recorder.actor_urn) is None


async def test_stop_all_stops_every_asyncio_actor():
    if pykka.ActorRegistry.get_by_class(AsyncioActor):
        pytest.skip("other AsyncioActors are running (e.g. session fixtures)")
    refs = [Recorder.start() for _ in range(3)]
    assert await stop_all() == [True, True, True]
    assert not any(ref.is_alive() for ref in refs)
    assert pykka.ActorRegistry.get_by_class(AsyncioActor) == []


async def test_proxy_calls_methods_and_reads_attributes(recorder):
    proxy = recorder.proxy()
    assert await proxy.add(3) == 3
    assert await proxy.add(4) == 7
    assert await proxy.total == 7


async def test_derived_futures_are_awaitable(recorder):
    # map/join (like stop()) compute through get hooks that call get() on
    # pending futures; awaiting them must wait instead of raising.
    first = recorder.proxy().slow_add(1, 0.01)
    second = recorder.proxy().slow_add(2, 0.01)
    assert await first.map(lambda total: total * 100) == 100
    assert await first.join(second) == [1, 3]


async def test_get_inside_the_loop_raises_instead_of_deadlocking(recorder):
    future = recorder.proxy().slow_add(1, 0.01)
    with pytest.raises(RuntimeError, match="await"):
        future.get()
    assert await future == 1
    assert future.get() == 1  # once done, get() cannot block


async def test_blocking_get_from_another_thread_works(recorder):
    future = recorder.proxy().slow_add(2, 0.01)
    assert await asyncio.to_thread(future.get, timeout=5) == 2
    # A whole blocking ask from a worker thread, too.
    assert await asyncio.to_thread(recorder.ask, {"x": 3}, timeout=5) == 30


async def test_blocking_get_from_another_thread_times_out():
    future = AsyncioFuture()
    with pytest.raises(pykka.Timeout):
        await asyncio.to_thread(future.get, timeout=0.01)
    future.set(1)  # the timed-out get did not cancel the future
    assert await future == 1


async def test_future_can_be_set_from_another_thread():
    future = AsyncioFuture()
    assert not future.done()
    threading.Thread(target=future.set, args=("hi",)).start()
    assert await asyncio.wait_for(future, timeout=5) == "hi"
    assert future.done()


async def test_start_without_a_running_loop_fails_clearly():
    def start_in_thread():
        with pytest.raises(RuntimeError, match="running event loop"):
            Recorder.start()

    await asyncio.to_thread(start_in_thread)
    assert pykka.ActorRegistry.get_by_class(Recorder) == []
