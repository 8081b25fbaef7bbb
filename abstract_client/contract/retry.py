"""Which failures may be retried, and how long to wait. Decided by type, never by message text.

Retried: a connection refused before anything was sent (``ConnectionFailedError``), 429/503 that
say when to come back (``Retry-After``), and 502/504. Never retried: a stop, a timeout, a
transport error after the request was sent (the server may be generating), anything else. The
backoff sleep runs inside the call's cancel scope, so a stop ends it at once.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from ..errors import AbstractClientError, GenerationCancelledError, GenerationTimeoutError

__all__ = ["RetryPolicy"]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How many retries, and the backoff: ``should_retry`` by type and ``retryable`` flag, ``delay``
    from ``Retry-After`` or capped full-jitter backoff."""

    max_retries: int = 2
    base_delay: float = 0.25
    max_delay: float = 8.0
    max_retry_after: float = 60.0

    def should_retry(self, error: BaseException, attempt: int) -> bool:
        """``attempt`` counts from 0 for the first try."""
        if attempt >= self.max_retries:
            return False
        if isinstance(error, (GenerationCancelledError, GenerationTimeoutError)):
            return False
        return isinstance(error, AbstractClientError) and error.retryable

    def delay(self, error: BaseException, attempt: int) -> float:
        retry_after = getattr(error, "retry_after", None)
        if isinstance(retry_after, (int, float)) and retry_after >= 0:
            return min(float(retry_after), self.max_retry_after)
        # capped exponential backoff with full jitter
        return random.uniform(0, min(self.max_delay, self.base_delay * (2**attempt)))
