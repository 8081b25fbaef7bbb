"""The stop contract, one module per rule group; ``abstract_client/contract.py`` is the index."""

from .admission import admit, release
from .call import Call, CallSpec, Progress
from .embed import run_embedding
from .run import operation_spec, result_of, run_generation, run_operation, with_retries
from .scope import deadline, needs_scope, step
from .stream import GenerationStream, open_source
from .translate import attach, cancelled, classify, translate

__all__ = [
    "Call",
    "CallSpec",
    "GenerationStream",
    "Progress",
    "admit",
    "attach",
    "cancelled",
    "classify",
    "deadline",
    "needs_scope",
    "open_source",
    "operation_spec",
    "release",
    "result_of",
    "run_embedding",
    "run_generation",
    "run_operation",
    "step",
    "translate",
    "with_retries",
]
