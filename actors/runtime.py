"""pykka actors that run as asyncio tasks instead of threads.

An `AsyncioActor` keeps pykka's API (`start()`, `ActorRef.tell/ask/stop`,
`proxy()`, `ActorRegistry`) but its message loop is a single task on the
running event loop. Everything that pykka would hand back as a blocking future
is an `AsyncioFuture` here, which must be awaited from the loop:

    ref = Counter.start()
    await ref.proxy().add(1)
    await ref.ask({"x": 1}, block=False)
    await ref.stop(block=False)

Handlers may be plain methods or coroutines. A coroutine returned by a handler
is awaited inside the actor task before the next message is taken, so the
actor's state is never touched by two messages at once.

Blocking calls (`ask(block=True)`, `stop(block=True)`, `future.get()` on a
pending future) only work from threads other than the loop's; from the loop
they raise `RuntimeError` instead of deadlocking.

This module logs with loguru, like the rest of the broker. pykka's own code
(actor start, unhandled failures) logs to the stdlib "pykka" logger, which the
broker routes into loguru (`setup_logging` in broker/__main__.py).
"""

from __future__ import annotations

import asyncio
import inspect
import sys
from collections.abc import Awaitable, Callable, Coroutine, Generator
from types import TracebackType
from typing import (
    TYPE_CHECKING,
    Any,
    Concatenate,
    Generic,
    ParamSpec,
    Protocol,
    TypeVar,
    cast,
    overload,
)

import pykka
from loguru import logger
from pykka import ActorDeadError, ActorRegistry, messages
from pykka._future import _Unset  # the "no get-hook result yet" marker of pykka.Future

if TYPE_CHECKING:
    from pykka._envelope import Envelope
    from pykka._types import OptExcInfo

__all__ = [
    "AsyncioActor",
    "AsyncioFuture",
    "ProxyMethod",
    "ResultNotReadyError",
    "proxied",
    "stop_all",
    "typed_proxy",
]

T = TypeVar("T")
P = ParamSpec("P")
R_co = TypeVar("R_co", covariant=True)
V = TypeVar("V")

# The loop of the most recently started actor. Futures created outside any
# running loop (an `ask` from a worker thread) are bound to it, because that is
# where the actor will set them. The broker runs a single event loop.
_default_loop: asyncio.AbstractEventLoop | None = None

# asyncio keeps only weak references to tasks; this keeps actor tasks alive.
_actor_tasks: set[asyncio.Task[None]] = set()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class ResultNotReadyError(RuntimeError):
    """`get()` was called on a pending future from an event loop thread.

    Blocking there would stop the loop that has to produce the result, so this
    is raised instead. `future` is the pending future: await it.
    """

    def __init__(self, future: AsyncioFuture[Any]) -> None:
        super().__init__(
            "AsyncioFuture.get() called from an event loop thread before the "
            "result is ready; blocking here would deadlock the loop. "
            "Use `await future` instead."
        )
        self.future = future


class AsyncioFuture(pykka.Future[T]):
    """A pykka future backed by an `asyncio.Future` of the actor's loop.

    Await it from the loop; call `get()` from other threads. It may be set from
    any thread: from a foreign thread the result is handed to the loop with
    `call_soon_threadsafe`, since `asyncio.Future` is not thread-safe.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__()
        loop = loop or _running_loop() or _default_loop
        if loop is None:
            msg = "AsyncioFuture needs an event loop: start an AsyncioActor first"
            raise RuntimeError(msg)
        self._loop = loop
        self._future: asyncio.Future[Any] = loop.create_future()

    def __repr__(self) -> str:
        return f"<AsyncioFuture done={self.done()}>"

    def done(self) -> bool:
        if self._get_hook is not None:
            # A derived future (map, join, stop, ...) is done once computed.
            return not isinstance(self._get_hook_result, _Unset)
        return self._future.done()

    def set(self, value: Any | None = None) -> None:
        self._settle(self._future.set_result, value)

    def set_exception(self, exc_info: OptExcInfo | None = None) -> None:
        assert exc_info is None or len(exc_info) == 3
        exc_type, exc_value, traceback = exc_info or sys.exc_info()
        assert exc_type is not None
        if exc_value is None:
            exc_value = exc_type()
        if traceback is not None and exc_value.__traceback__ is not traceback:
            exc_value = exc_value.with_traceback(traceback)
        self._settle(self._future.set_exception, exc_value)

    def _settle(self, setter: Any, arg: Any) -> None:
        if _running_loop() is self._loop:
            self._settle_in_loop(setter, arg)
        else:
            self._loop.call_soon_threadsafe(self._settle_in_loop, setter, arg)

    def _settle_in_loop(self, setter: Any, arg: Any) -> None:
        # An awaiter that was cancelled (e.g. by asyncio.wait_for) cancels the
        # inner future; the late reply then has nobody to go to.
        if not self._future.cancelled():
            setter(arg)

    def get(self, *, timeout: float | None = None) -> Any:
        if self._get_hook is not None:
            return super().get(timeout=timeout)
        if self._future.done():
            return self._future.result()
        if _running_loop() is not None:
            raise ResultNotReadyError(self)
        waiter = asyncio.run_coroutine_threadsafe(self._wait_done(), self._loop)
        try:
            return waiter.result(timeout)
        except TimeoutError:
            waiter.cancel()
            msg = f"{timeout} seconds"
            raise pykka.Timeout(msg) from None

    async def _wait_done(self) -> Any:
        # asyncio.wait() does not cancel self._future when a timed-out get()
        # cancels this coroutine; a plain `await` would.
        await asyncio.wait([self._future])
        return self._future.result()

    def __await__(self) -> Generator[Any, None, T]:
        if self._get_hook is None:
            return (yield from self._future.__await__())
        # A derived future: its get hook calls get() on the futures it derives
        # from. Await whichever one is still pending, then run the hook again.
        while True:
            try:
                return cast("T", self.get())
            except ResultNotReadyError as not_ready:
                try:
                    yield from not_ready.future.__await__()
                except Exception:
                    pass  # the hook sees (and may handle) it when rerun

    __iter__ = __await__


class _AsyncioInbox:
    """pykka's ActorInbox protocol on top of an `asyncio.Queue`.

    `put()` works from any thread; `get()` is pykka's synchronous, non-blocking
    variant (used while tearing down), `receive()` is what the actor awaits.
    """

    def __init__(self) -> None:
        self._queue: asyncio.Queue[Envelope[Any]] = asyncio.Queue()
        self.loop: asyncio.AbstractEventLoop | None = None  # set when the actor starts

    def put(self, envelope: Envelope[Any], /) -> None:
        if self.loop is None or _running_loop() is self.loop:
            self._queue.put_nowait(envelope)
        else:
            self.loop.call_soon_threadsafe(self._queue.put_nowait, envelope)

    def get(self) -> Envelope[Any]:
        return self._queue.get_nowait()

    def empty(self) -> bool:
        return self._queue.empty()

    async def receive(self) -> Envelope[Any]:
        return await self._queue.get()


async def _maybe_await(value: Any) -> Any:
    if inspect.iscoroutine(value):
        return await value
    return value


class AsyncioActor(pykka.Actor):
    """A pykka actor whose message loop is one task on the running event loop.

    Hooks (`on_start`, `on_stop`, `on_failure`, `on_receive`) and proxied
    methods may be sync or `async def`. Never block inside them: the whole
    loop would stall.
    """

    actor_inbox: _AsyncioInbox

    @staticmethod
    def _create_actor_inbox() -> _AsyncioInbox:
        return _AsyncioInbox()

    @staticmethod
    def _create_future() -> AsyncioFuture[Any]:
        return AsyncioFuture()

    # pykka types these hooks as returning None; here they may also be coroutine functions,
    # whose coroutine the actor's task awaits. The no-op bodies are pykka's.
    def on_start(self) -> Awaitable[None] | None:  # type: ignore[override]
        return None

    def on_stop(self) -> Awaitable[None] | None:  # type: ignore[override]
        return None

    def on_failure(  # type: ignore[override]
        self,
        exception_type: type[BaseException] | None,
        exception_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> Awaitable[None] | None:
        return None

    def _start_actor_loop(self) -> None:
        global _default_loop
        loop = _running_loop()
        if loop is None:
            # Actor.start() registered us already; undo that before failing.
            ActorRegistry.unregister(self.actor_ref)
            self.actor_stopped.set()
            msg = f"{type(self).__name__}.start() must be called with a running event loop"
            raise RuntimeError(msg)
        _default_loop = loop
        self.actor_inbox.loop = loop
        task = loop.create_task(self._run(), name=str(self))
        _actor_tasks.add(task)
        task.add_done_callback(_actor_tasks.discard)

    async def _run(self) -> None:
        try:
            await self._run_setup()
            await self._run_messages()
        finally:
            # Also reached when the task is cancelled (loop shutdown): never
            # leave a dead actor registered or asks waiting forever.
            if not self.actor_stopped.is_set():
                ActorRegistry.unregister(self.actor_ref)
                self.actor_stopped.set()
            self._actor_loop_teardown()

    async def _run_setup(self) -> None:
        try:
            await _maybe_await(self.on_start())
        except Exception:
            self._handle_failure(*sys.exc_info())

    async def _run_messages(self) -> None:
        # Mirrors pykka.Actor._actor_loop_running, awaiting async handlers.
        while not self.actor_stopped.is_set():
            envelope = await self.actor_inbox.receive()
            try:
                response = await self._handle_receive_async(envelope.message)
                if envelope.reply_to is not None:
                    envelope.reply_to.set(response)
            except Exception:
                if envelope.reply_to is not None:
                    # The asker gets the exception and decides what it means. pykka logs
                    # this at INFO; at the broker's default INFO that would be a traceback
                    # for every failed ask a caller already handles, so: DEBUG.
                    logger.opt(exception=True).debug("Exception returned from {} to caller:",
                                                     self)
                    envelope.reply_to.set_exception()
                else:
                    self._handle_failure(*sys.exc_info())
                    try:
                        await _maybe_await(self.on_failure(*sys.exc_info()))
                    except Exception:
                        self._handle_failure(*sys.exc_info())
            except BaseException:
                # Cancelled mid-message: the asker must not wait forever.
                # Unlike pykka's threads, other actors are left running.
                if envelope.reply_to is not None:
                    envelope.reply_to.set_exception(
                        (ActorDeadError, ActorDeadError(f"{self} was cancelled"), None)
                    )
                raise

    async def _handle_receive_async(self, message: Any) -> Any:
        if isinstance(message, messages._ActorStop):
            await self._stop_async()
            return None
        return await _maybe_await(self._handle_receive(message))

    async def _stop_async(self) -> None:
        # pykka.Actor._stop, with an on_stop that may be a coroutine.
        ActorRegistry.unregister(self.actor_ref)
        self.actor_stopped.set()
        logger.debug("Stopped {}", self)
        try:
            await _maybe_await(self.on_stop())
        except Exception:
            self._handle_failure(*sys.exc_info())


# -- typed proxies ----------------------------------------------------------------------
#
# pykka's ActorProxy answers every attribute with Any, so nothing called through a proxy is
# type-checked. A *proxy view* is a plain class that lists an actor's methods as its proxy
# shows them, each built with `proxied(Actor.method)`: the same parameters, and the result
# wrapped in the AsyncioFuture the proxy hands back (a coroutine method's future resolves
# to what the coroutine returns, since the actor task awaits it). `typed_proxy` gives a
# proxy that view's type. Both are for the type checker only: `proxied` returns the method
# itself and `typed_proxy` the proxy itself.
#
#     class SpoolProxy:
#         stats = proxied(Spool.stats)          # async def stats(self) -> dict[str, Any]
#
#     spool = typed_proxy(SpoolProxy, Spool.start(...).proxy())
#     figures = await spool.stats()             # dict[str, Any]
#
# A view is not an ActorProxy subclass on purpose: ActorProxy.__getattr__ would make any
# name, missing or misspelt, type-check as Any.


class ProxyMethod(Protocol, Generic[P, R_co]):
    """An actor method as a proxy view shows it: read from an instance, a callable with
    the method's parameters (``self`` aside) returning ``R_co``."""

    def __get__(self, instance: Any, owner: type | None = None) -> Callable[P, R_co]: ...


@overload
def proxied(
    method: Callable[Concatenate[Any, P], Coroutine[Any, Any, T]],
) -> ProxyMethod[P, AsyncioFuture[T]]: ...
@overload
def proxied(method: Callable[Concatenate[Any, P], T]) -> ProxyMethod[P, AsyncioFuture[T]]: ...
def proxied(method: Callable[..., Any]) -> Any:
    """Type ``method`` (an actor's, taken from its class) as a proxy view's member."""
    return method


def typed_proxy(view: type[V], proxy: pykka.ActorProxy[Any]) -> V:
    """``proxy``, typed as the proxy view ``view`` (see above); the proxy itself at run time.

    The caller vouches that ``view`` is a view of the proxied actor's class (like pykka's own
    ``cast(CircleProxy, ref.proxy())`` idiom); the view's members are checked against the
    actor's methods where the view is defined."""
    return cast("V", proxy)


async def stop_all() -> list[bool]:
    """Stop every registered AsyncioActor, last started first, one at a time.

    Returns what each `stop()` returned (False if it was already dead).
    """
    refs = [
        ref
        for ref in reversed(ActorRegistry.get_all())
        if issubclass(ref.actor_class, AsyncioActor)
    ]
    return [await ref.stop(block=False) for ref in refs]
