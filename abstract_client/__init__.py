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
from .provider import (
    CallContext,
    Completion,
    EmbeddingBatch,
    EngineRecord,
    HttpProvider,
    InProcessProvider,
    ModelInfo,
    Provider,
    RoutingProvider,
    UnloadReport,
)
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
    "AbortController",
    "AbortError",
    "AbortSignal",
    "AbstractClientError",
    "CallContext",
    "ChunkKind",
    "Completion",
    "ConnectionFailedError",
    "ContentPart",
    "ContextOverflowError",
    "EmbeddingBatch",
    "EmbeddingResult",
    "EngineRecord",
    "Fleet",
    "GenerateOptions",
    "GenerateResult",
    "GenerationCancelledError",
    "GenerationRequest",
    "GenerationStream",
    "GenerationTimeoutError",
    "HttpProvider",
    "ImageInputError",
    "ImageLimits",
    "InProcessProvider",
    "InvalidRequestError",
    "LLM",
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
    "ProxyError",
    "RateLimitError",
    "RequestIdFilter",
    "ResponseFormat",
    "RoutingProvider",
    "ServerUnavailableError",
    "StreamChunk",
    "SyncGenerationStream",
    "TLSCertificateError",
    "Timeout",
    "Timings",
    "ToolCall",
    "ToolCallDelta",
    "TransportError",
    "UnloadReport",
    "Usage",
    "__version__",
    "available_providers",
    "continue_after",
    "create_llm",
    "function_tool",
    "image_part",
    "register_provider",
]
