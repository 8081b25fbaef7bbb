"""The stop contract: the ONE path every generation takes, readable in one sitting.

Sync and async, streaming and non-streaming, retries and structured output all run through
:func:`run_generation` or :class:`GenerationStream` (the sync API drives these same coroutines on
the LLM's own loop thread); embeddings through :func:`run_embedding` (a step per batch); model
management and token counting through :func:`run_operation`. Each rule has one function, in a
module of this package:

====  =====================================================================  =========================
rule  what                                                                   where
====  =====================================================================  =========================
1     a stop already requested → ``GenerationCancelledError``, nothing sent  ``admission.admit_now``
2     admitted calls are registered in flight (``cancel(id)``, eject) and    ``admission.admit`` /
      hold their stop sources only until released, on every exit path        ``admission.release``
3     every await on the backend is stoppable from any thread and bounded    ``scope.step``,
      by its deadline; a live private socket is severed by the stop itself   ``scope.needs_scope``
4     any failure while the stop is set IS the stop (translated once)        ``translate.translate``
5     a framework cancellation severs and is re-raised unchanged             ``translate.translate``
6     never retry a stop or a timeout; the backoff sleeps in the same scope  ``run.with_retries``
7     a stop requested before the result is handed over wins                 ``run.run_generation``,
                                                                             ``stream._deliver``
8     every error carries partial text, tokens, usage, provider, model, id   ``translate.attach``
====  =====================================================================  =========================

``lifecycle.py`` holds a call's phases and the moves between them (one table; telemetry observes
the moves); ``call.py`` holds what a call is (its spec, fixed when built, and its progress); ``retry.py``
the retry policy (which failures may be retried, by type; the backoff); ``answer.py`` where
structured output and tool calls enter and leave the path (prepared after admission, parsed only
once the answer is judged complete).
"""

from .admission import hand_over, release
from .call import Call, CallSpec, Progress
from .embed import run_embedding
from .retry import RetryPolicy
from .run import operation_spec, run_generation, run_operation
from .stream import GenerationStream
from .translate import SyncStop, cancelled, stop_error, translate

__all__ = [
    "Call",
    "CallSpec",
    "GenerationStream",
    "Progress",
    "RetryPolicy",
    "SyncStop",
    "cancelled",
    "hand_over",
    "operation_spec",
    "release",
    "run_embedding",
    "run_generation",
    "run_operation",
    "stop_error",
    "translate",
]
