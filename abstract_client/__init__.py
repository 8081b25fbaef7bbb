"""abstract-client: asyncio-native LLM client where Stop means stop, on every backend."""

from __future__ import annotations

import logging

from . import _checkout  # noqa: F401  (a checkout's abstract_client.providers)
from ._sync import SyncGenerationStream
from .contract import GenerationStream
from .errors import (
    AbortError,
    AbstractClientError,
    ConnectionFailedError,
    ContextOverflowError,
    GenerationCancelledError,
    GenerationTimeoutError,
    ImageInputError,
    InvalidRequestError,
    ModelBusyError,
    ModelNotFoundError,
    NetworkError,
    NotSupportedError,
    OutputValidationError,
    ProviderAPIError,
    ProviderError,
    ProviderProtocolError,
    ProxyError,
    RateLimitError,
    ServerUnavailableError,
    TLSCertificateError,
    TransportError,
)
from .fleet import Fleet
from .images import ImageLimits, image_part
from .llm import LLM, GenerateOptions
from .output.history import continue_after
from .output.structured import function_tool
from .provider import CallContext, Completion, EmbeddingBatch, ModelInfo, Provider, UnloadReport
from .registry import available_providers, create_llm, register_provider
from .stopping.abort import AbortController, AbortSignal
from .telemetry import RequestIdFilter
from .types import (
    ChunkKind,
    ContentPart,
    EmbeddingResult,
    GenerateResult,
    GenerationRequest,
    Message,
    ResponseFormat,
    StreamChunk,
    Timeout,
    Timings,
    ToolCall,
    ToolCallDelta,
    Usage,
)

__version__ = "0.1.0"

logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [
    "LLM",
    "ImageInputError",
    "ImageLimits",
    "image_part",
    "GenerateOptions",
    "AbortController",
    "AbortError",
    "AbortSignal",
    "AbstractClientError",
    "CallContext",
    "Completion",
    "ContentPart",
    "ConnectionFailedError",
    "ContextOverflowError",
    "EmbeddingBatch",
    "EmbeddingResult",
    "Fleet",
    "GenerateResult",
    "GenerationCancelledError",
    "GenerationRequest",
    "GenerationStream",
    "GenerationTimeoutError",
    "InvalidRequestError",
    "Message",
    "ModelBusyError",
    "ModelInfo",
    "ModelNotFoundError",
    "NetworkError",
    "NotSupportedError",
    "OutputValidationError",
    "Provider",
    "ProviderAPIError",
    "ProviderError",
    "ProviderProtocolError",
    "RateLimitError",
    "RequestIdFilter",
    "ResponseFormat",
    "ServerUnavailableError",
    "StreamChunk",
    "ChunkKind",
    "SyncGenerationStream",
    "Timeout",
    "Timings",
    "ToolCall",
    "ToolCallDelta",
    "TLSCertificateError",
    "ProxyError",
    "TransportError",
    "UnloadReport",
    "Usage",
    "__version__",
    "available_providers",
    "continue_after",
    "create_llm",
    "function_tool",
    "register_provider",
]
