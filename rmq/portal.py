"""The portal: one Trio loop in a daemon thread that the blocking (`rmq.sync`) and asyncio
(`rmq.aio`) clients run the Trio clients on.

Theory of operation: the portal thread runs `trio.run` forever, started on first use. `run`
hands a coroutine function to that loop (`trio.from_thread.run`) and blocks for its result;
`submit` starts it as a portal task and returns a `concurrent.futures.Future` (cancelling the
future cancels the task) without blocking, which is what an asyncio loop needs. An async client
is an async context manager whose connections live in a nursery that one task must enter and
leave, so `enter` starts a holder task (`hold`) that enters `async with client`, hands back a
`Lease`, and leaves when `exit` sets the lease's release event; an error raised on leaving is
re-raised in the caller's thread. `takes_arguments_of` gives a bridge class the constructor
signature of the Trio client it wraps, for type checkers and `inspect.signature` alike; the
bridges' methods are written out, and tests/rmq/test_public_signatures.py keeps them equal to
the Trio methods.
"""

from __future__ import annotations

import concurrent.futures
import inspect
import threading
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Concatenate, ParamSpec, TypeVar, TypeVarTuple

import attrs
import trio

from common.errors import unwrap_group

T = TypeVar("T")
P = ParamSpec("P")
Ts = TypeVarTuple("Ts")


@attrs.define(eq=False)
class Lease:
    value: Any
    release: trio.Event
    exited: trio.Event
    # set by the holder if leaving the `async with` raised
    error: BaseException | None = None


class Portal:
    """A Trio loop in a daemon thread; `run` executes a coroutine function there."""

    def __init__(self) -> None:
        self._ready = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._thread = threading.Thread(target=self._main, name="rmq-sync-portal", daemon=True)
        self._thread.start()
        self._ready.wait()

    def _main(self) -> None:
        trio.run(self._amain)

    async def _amain(self) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self._token = trio.lowlevel.current_trio_token()
            self._ready.set()
            await trio.sleep_forever()

    def run(self, afn: Callable[[*Ts], Awaitable[T]], *args: *Ts) -> T:
        try:
            return trio.from_thread.run(afn, *args, trio_token=self._token)
        except BaseExceptionGroup as group:
            inner = unwrap_group(group)
            if inner is group:
                raise
            raise inner from None

    @property
    def token(self) -> trio.lowlevel.TrioToken:
        assert self._token is not None
        return self._token

    def submit(
        self, afn: Callable[[*Ts], Awaitable[T]], *args: *Ts
    ) -> concurrent.futures.Future[T]:
        """Start `afn(*args)` as a portal task now; its outcome lands in the returned future.

        Never blocks (safe from an asyncio loop). Cancelling the future cancels the task; a
        task the portal itself cancels leaves the future cancelled, never pending forever.
        """
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        scope = trio.CancelScope()

        async def runner() -> None:
            try:
                with scope:
                    settle(fut, result=await afn(*args))
            except Exception as exc:
                settle(fut, error=unwrap_group(exc))
            finally:
                if not fut.done():
                    fut.cancel()

        def on_done(f: concurrent.futures.Future[T]) -> None:
            if f.cancelled():
                try:
                    self.token.run_sync_soon(scope.cancel)
                except trio.RunFinishedError:
                    pass

        fut.add_done_callback(on_done)
        assert self._nursery is not None
        self.token.run_sync_soon(self._nursery.start_soon, runner)
        return fut

    def enter(self, acm: AbstractAsyncContextManager[object]) -> Lease:
        assert self._nursery is not None
        return self.run(self._nursery.start, hold, acm)

    def exit(self, lease: Lease) -> None:
        trio.from_thread.run_sync(lease.release.set, trio_token=self._token)
        self.run(lease.exited.wait)
        if lease.error is not None:
            raise lease.error


def settle(
    fut: concurrent.futures.Future[Any],
    *,
    result: object = None,
    error: BaseException | None = None,
) -> None:
    """Complete `fut` unless its waiter cancelled it meanwhile (then the outcome is dropped)."""
    try:
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result)
    except concurrent.futures.InvalidStateError:
        pass


async def hold(
    acm: AbstractAsyncContextManager[object],
    task_status: trio.TaskStatus[Lease] = trio.TASK_STATUS_IGNORED,
) -> None:
    lease: Lease | None = None
    try:
        async with acm as value:
            lease = Lease(value, trio.Event(), trio.Event())
            task_status.started(lease)
            await lease.release.wait()
    except Exception as exc:
        if lease is None:
            raise  # failed to open: nursery.start re-raises it in the caller
        lease.error = unwrap_group(exc)
    finally:
        if lease is not None:
            lease.exited.set()


_portal: Portal | None = None
_portal_lock = threading.Lock()


def get_portal() -> Portal:
    global _portal
    with _portal_lock:
        if _portal is None:
            _portal = Portal()
        return _portal


def takes_arguments_of(
    client_cls: Callable[P, object],
) -> Callable[[Callable[..., None]], Callable[Concatenate[Any, P], None]]:
    """Decorates a bridge's `__init__(self, *args, **kwargs)` that forwards its arguments to
    `client_cls`: type checkers then see `client_cls`'s parameters (names, defaults, types), and
    so does `inspect.signature` (help(), editors that read the runtime signature)."""

    takes = inspect.signature(client_cls)
    self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)

    def decorate(init: Callable[..., None]) -> Callable[Concatenate[Any, P], None]:
        # functions take any attribute; typeshed declares no `__signature__` on them
        init.__signature__ = takes.replace(  # type: ignore[attr-defined]
            parameters=[self_param, *takes.parameters.values()]
        )
        return init

    return decorate


__all__ = ["Lease", "Portal", "get_portal", "hold", "takes_arguments_of"]
