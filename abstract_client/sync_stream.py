"""The sync face of :class:`GenerationStream`: an iterator that is also a context manager.

Each ``next()`` runs the async stream's ``__anext__`` on the portal loop, so sync and async share
one contract. ``break`` out of ``for chunk in llm.stream(...)`` drops the last reference; CPython
runs ``__del__`` at once, which severs the socket synchronously (no GC pass needed: nothing here
is in a reference cycle).
"""

from __future__ import annotations

from typing import Any

from ._portal import Portal
from .contract import GenerationStream, stopped_error
from .types import GenerateResult, StreamChunk


class SyncGenerationStream:
    def __init__(self, inner: GenerationStream, portal: Portal, owner: Any = None) -> None:
        self._inner = inner
        self._portal = portal
        self._owner = owner  # the LLM: its loop thread must outlive this stream
        self._stopped = False

    def __repr__(self) -> str:
        return repr(self._inner).replace("GenerationStream", "SyncGenerationStream")

    @property
    def request_id(self) -> str:
        return self._inner.request_id

    @property
    def text(self) -> str:
        return self._inner.text

    def result(self) -> GenerateResult:
        return self._inner.result()

    def cancel(self, reason: str = "user") -> None:
        """Stop from any thread; the iterating thread gets ``GenerationCancelledError``."""
        self._inner.cancel(reason)

    def __iter__(self) -> SyncGenerationStream:
        return self

    def __next__(self) -> StreamChunk:
        inner = self._inner
        if self._stopped or inner.state == "done":  # finished: a later cancel() changes nothing
            raise StopIteration
        call = inner.call
        try:
            return self._portal.run(
                inner.__anext__,
                on_interrupt=inner.cancel,
                stop=call.token,
                stopped_error=lambda: stopped_error(call),
                on_abandon=inner.aclose,
            )
        except StopAsyncIteration:
            raise StopIteration from None
        except BaseException:
            self._stopped = True
            raise

    def close(self) -> None:
        if self._inner.state == "open":
            self._portal.run(self._inner.aclose)
        else:
            self._inner.abandon()

    def __enter__(self) -> SyncGenerationStream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
