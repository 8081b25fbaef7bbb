"""The loaded GGUF model, as the engine thread sees it: one llama-cpp-python ``Llama`` (the
weights and one context), loaded, used and closed on that thread only; on the first ``embed``
call a second context with embeddings on over the same (memory-mapped) weights.

**Close never frees under a decode.** llama-cpp-python's ``close()`` takes no lock (its crash
reports: a model freed while a worker thread still evaluated). Here a request holds
:attr:`GGUFModel.lock` for every call it makes into llama.cpp (tokenize, decode, sample), and
:meth:`GGUFModel.close` (which ``__del__`` calls) takes it too: a close from another thread first
aborts the evaluation in flight (the request's abort flag; the request then ends with a typed
error), then waits for the request to let go of the model, then frees it.

**The stop inside one evaluation.** ggml's CPU backend calls the context's abort callback after
every graph node, on the computing thread; when it returns true the graph ends early, and
``llama_decode`` returns 2 with the aborted micro-batch's KV cells removed. The callback we
install is libc's ``strlen``, over a request's own two-byte flag: 0 until the stop writes the
flag's first byte, then 1. No Python runs per node — a ctypes callback would take the GIL after
each of the ~500 nodes of a pass (and wait up to the 5 ms switch interval whenever the event
loop holds it).
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.util
import json
import logging
import os
import sys
import threading
from pathlib import Path
from typing import Any

from abstract_client.errors import NotSupportedError
from abstract_client.types import GenerationRequest

from .._engine import EngineStop
from .._memory import give_memory_back, rss_bytes
from .._shaping import chat_messages

__all__ = ["GGUFModel", "import_llama_cpp", "shared_library_dir"]

log = logging.getLogger(__name__)

ABORTED = 2  # llama_decode's return code for an evaluation its abort callback ended


def shared_library_dir() -> Path | None:
    """Where llama-cpp-python should load libllama from, when its package has no library of its
    own (installed with ``-DLLAMA_BUILD=OFF``): the shared llama.cpp build that
    ``get_llama_server.sh`` made for llama-server, from the same sdist version."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None
    if (Path(next(iter(spec.submodule_search_locations))) / "lib" / "libllama.so").exists():
        return None  # a full install carries its own build
    version = importlib.metadata.version("llama_cpp_python")
    cache = Path(os.environ.get("ABSTRACT_CLIENT_CACHE", Path.home() / ".cache" / "abstract-client"))
    candidate = cache / "llama-server" / f"{version}-avx2-shared"
    return candidate if (candidate / "libllama.so").exists() else None


def import_llama_cpp() -> Any:
    """llama-cpp-python over llama-server's build (its library found), with llama.cpp's log routed to
    ``logging``."""
    if "llama_cpp" not in sys.modules and not os.environ.get("LLAMA_CPP_LIB_PATH"):
        found = shared_library_dir()
        if found is not None:
            os.environ["LLAMA_CPP_LIB_PATH"] = str(found)
    try:
        import llama_cpp
    except ImportError as exc:
        raise NotSupportedError(
            "the gguf lane needs llama-cpp-python: pip install 'abstract-client[gguf]' "
            "(or scripts/get_llama_cpp_python.sh, which reuses llama-server's llama.cpp build)",
            provider="gguf",
        ) from exc
    _route_logs(llama_cpp)
    return llama_cpp


_log_callback: Any = None
_engine_log = logging.getLogger("abstract_client.providers.gguf.llama_cpp")


def _route_logs(llama_cpp: Any) -> None:
    """llama.cpp's own log lines go to stdlib logging, at DEBUG, never straight to stderr.
    Whatever llama.cpp's level (an aborted evaluation logs a WARN line per stop: "decode:
    removing memory module entries ..."), they are the engine's diagnostics, not the
    application's business: a failure reaches the caller as a typed error, and an app logging
    at WARNING (or Python's last-resort handler, with no logging set up) must not print them."""
    global _log_callback
    if _log_callback is not None:
        return

    def on_log(level: int, text: bytes, user_data: Any) -> None:
        _engine_log.debug("%s", text.decode("utf-8", "replace").rstrip())

    _log_callback = llama_cpp.llama_log_callback(on_log)  # kept: a collected callback would dangle
    llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))


_strlen: Any = None


def _abort_callback(llama_cpp: Any) -> Any:
    """libc's ``strlen`` as a ``ggml_abort_callback`` (see the module's docstring)."""
    global _strlen
    if _strlen is None:
        libc = ctypes.CDLL(None)
        address = ctypes.cast(libc.strlen, ctypes.c_void_p).value
        _strlen = llama_cpp.ggml_abort_callback(address)  # kept: a collected pointer would dangle
    return _strlen


class TextView:
    """The model's tokenizer as the shared detokenizer calls it (``decode(ids, ...)``)."""

    def __init__(self, llm: Any) -> None:
        self._llm = llm

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return str(self._llm.detokenize(ids, special=not skip_special_tokens).decode("utf-8", errors="replace"))


class GGUFModel:
    """The gguf lane's model: a ``Llama`` under its decode lock, the abort callback's flag, prefix
    reuse, the sampler chain."""

    def __init__(
        self,
        path: Path,
        *,
        n_ctx: int,
        n_batch: int,
        n_threads: int | None,
        n_gpu_layers: int,
        flash_attn: bool,
        abort_callback: bool,
        default_max_tokens: int,
        options: dict[str, Any],
    ) -> None:
        self.path = path
        self.n_ctx, self.n_batch = n_ctx, n_batch
        self.n_threads = n_threads or os.cpu_count() or 1
        self.n_gpu_layers = n_gpu_layers
        self.flash_attn = flash_attn
        self.abort_callback = abort_callback
        self.default_max_tokens = default_max_tokens
        self.options = options  # create_llm's extra options: the defaults of every request
        self.lock = threading.RLock()  # a request's llama.cpp calls, or a close: never both
        self.flag: ctypes.Array[ctypes.c_char] | None = None  # the running request's abort flag
        self.llm: Any = None
        self.embedder: Any = None
        self.text: TextView | None = None
        self._formatter: Any = None
        self._never = ctypes.create_string_buffer(2)  # the flag an idle context points at: never set
        self.rss_baseline: int | None = None
        self.ejected = False
        self.lib: Any = None  # the llama_cpp module, once loaded
        self._vocab: Any = None
        self._stray = False  # an aborted evaluation may have left KV cells past n_tokens
        self.decodes = 0  # llama_decode calls (evidence for tests)
        self.aborted = 0  # of which the abort callback ended

    @property
    def loaded(self) -> bool:
        return self.llm is not None

    def ensure_loaded(self) -> tuple[Any, Any]:
        if self.llm is None:
            llama_cpp = import_llama_cpp()
            if self.ejected:
                log.warning("gguf: reloading %s on demand after an eject", self.path)
            self.rss_baseline = rss_bytes()
            llm = self._open(llama_cpp)
            self.text = TextView(llm)
            template = llm.metadata.get("tokenizer.chat_template")
            if template:
                from llama_cpp.llama_chat_format import Jinja2ChatFormatter

                def text_of(token: int) -> str:
                    return str(llm._model.token_get_text(token)) if token != -1 else ""

                self._formatter = Jinja2ChatFormatter(
                    template, eos_token=text_of(llm.token_eos()), bos_token=text_of(llm.token_bos())
                )
            self.lib, self._vocab = llama_cpp, llm._model.vocab  # per-token calls skip the lookups
            self.llm = llm
            self.arm(None)
            self.ejected = False
        return self.llm, self.text

    # -- the stop inside an evaluation ----------------------------------------------------------------

    def arm(self, flag: ctypes.Array[ctypes.c_char] | None) -> None:
        """Point the context's abort callback at ``flag`` (a request's), or at a flag that is
        never set. The callback is installed once per context and only its data changes."""
        self.flag = flag
        if not self.abort_callback:
            return
        llama_cpp = import_llama_cpp()
        target = flag if flag is not None else self._never
        llama_cpp.llama_set_abort_callback(self.llm.ctx, _abort_callback(llama_cpp), ctypes.addressof(target))

    def decode(self, tokens: list[int]) -> None:
        """Evaluate ``tokens`` (at most ``n_batch``) after the context's ``n_tokens``. A stop
        that lands inside raises :class:`EngineStop`; the context then holds what it held before."""
        llm = self.llm
        n_past = llm.n_tokens
        if self._stray:  # whatever an aborted evaluation left past what the context counts
            llm._ctx.kv_cache_seq_rm(-1, n_past, -1)
            self._stray = False
        llm._batch.set_batch(batch=tokens, n_past=n_past, logits_all=False)
        with self.lock:
            self.decodes += 1
            code = self.lib.llama_decode(llm.ctx, llm._batch.batch)
        if code == ABORTED:
            self.aborted += 1
            self._stray = True
            raise EngineStop
        if code != 0:
            # 1: no room in the KV cache for this batch
            raise RuntimeError(f"llama_decode returned {code}")
        llm.input_ids[n_past : n_past + len(tokens)] = tokens
        llm.n_tokens = n_past + len(tokens)

    def reuse_prefix(self, ids: list[int]) -> int:
        """Keep the KV of the longest prefix ``ids`` shares with what the context holds (the
        previous turn, a Regenerate after a Stop), minus at least one token whose logits start
        the answer; drop the rest. Returns the tokens kept."""
        llm = self.llm
        held = llm.input_ids[: llm.n_tokens].tolist()
        keep = 0
        for a, b in zip(held, ids, strict=False):
            if a != b:
                break
            keep += 1
        keep = min(keep, len(ids) - 1)
        if not llm._ctx.kv_cache_seq_rm(-1, keep, -1):
            keep = 0
            llm._ctx.kv_cache_seq_rm(-1, 0, -1)
        llm.n_tokens = keep
        self._stray = False
        return keep

    # -- close ----------------------------------------------------------------------------------------

    def close(self) -> None:
        """Free both contexts and the weights, from any thread: abort the evaluation in flight,
        wait for its request to let go of the model, then free."""
        flag = self.flag
        if flag is not None:
            ctypes.memset(flag, 1, 1)
        with self.lock:
            llm, embedder = self.llm, self.embedder
            self.llm = self.embedder = self.text = self._formatter = None
            self._stray = False
            for engine in (embedder, llm):
                if engine is not None:
                    engine.close()
            del llm, embedder, engine

    def drop(self) -> None:
        """Forget the model and give its memory back (on the engine thread, idle)."""
        if self.llm is not None:
            self.ejected = True
        self.close()
        give_memory_back()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter teardown: modules may be gone
            pass

    # -- requests -------------------------------------------------------------------------------------

    def extra(self, request: GenerationRequest) -> dict[str, Any]:
        return {**self.options, **request.extra}

    def prompt_ids(self, request: GenerationRequest) -> list[int]:
        llm, _ = self.ensure_loaded()
        if request.raw:
            return list(llm.tokenize((request.prompt or "").encode(), add_bos=True, special=False))
        if self._formatter is None:
            raise NotSupportedError(f"{self.path.name} has no chat template in its metadata", provider="gguf")
        kwargs: dict[str, Any] = {}
        if request.tools:
            kwargs["tools"] = request.tools
        if request.reasoning is not None:
            kwargs["enable_thinking"] = request.reasoning is not False
        text = self._formatter(messages=chat_messages(request.messages, provider="gguf"), **kwargs).prompt
        # the template's text has its special tokens spelled out; the vocabulary says whether BOS is added
        return list(llm.tokenize(text.encode(), add_bos=True, special=True))

    def is_end(self, token: int) -> bool:
        return bool(self.lib.llama_vocab_is_eog(self._vocab, token))

    def sampler(self, request: GenerationRequest, extra: dict[str, Any], prompt_ids: list[int]) -> Any:
        """llama.cpp's own sampler chain for the request: repetition penalty (seeded with the
        prompt), logit bias, the JSON schema's grammar, then greedy or top-k/top-p/min-p/
        temperature from the request's own seed."""
        import random

        from llama_cpp import _internals
        from llama_cpp.llama_grammar import LlamaGrammar

        llm = self.llm
        chain: Any = _internals.LlamaSampler()  # type: ignore[no-untyped-call]
        penalty = extra.get("repetition_penalty")
        if penalty is not None:
            chain.add_penalties(
                n_vocab=llm.n_vocab(),
                penalty_last_n=int(extra.get("repetition_context_size", 64)),
                penalty_repeat=float(penalty),
                penalty_freq=0.0,
                penalty_present=0.0,
            )
            for token in prompt_ids:
                chain.accept(token)
        bias = extra.get("logit_bias")
        if bias:
            chain.add_logit_bias(llm.n_vocab(), {int(k): float(v) for k, v in bias.items()})  # JSON keys are strings
        fmt = request.response_format
        if fmt is not None:
            grammar = LlamaGrammar.from_json_schema(json.dumps(fmt.schema or {"type": "object"}), verbose=False)
            chain.add_grammar(llm._model, grammar)
        temperature = float(request.temperature or 0.0)
        if temperature <= 0:
            chain.add_greedy()
        else:
            chain.add_top_k(int(extra.get("top_k") or 0))
            chain.add_top_p(float(extra.get("top_p") or 1.0), 1)
            chain.add_min_p(float(extra.get("min_p") or 0.0), 1)
            chain.add_temp(temperature)
            chain.add_dist(int(request.seed) if request.seed is not None else random.getrandbits(32))
        return chain

    # -- embeddings -----------------------------------------------------------------------------------

    def ensure_embedder(self) -> Any:
        if self.embedder is None:
            llama_cpp = import_llama_cpp()
            self.ensure_loaded()
            self.embedder = self._open(llama_cpp, embedding=True, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN)
        return self.embedder

    def _open(self, llama_cpp: Any, **extra: Any) -> Any:
        """A ``Llama`` (weights memory-mapped, one context) with this lane's settings."""
        return llama_cpp.Llama(
            model_path=str(self.path),
            n_ctx=self.n_ctx,
            n_batch=self.n_batch,
            n_ubatch=self.n_batch,  # one micro-batch per llama_decode: an abort leaves no stray cells
            n_threads=self.n_threads,
            n_threads_batch=self.n_threads,
            n_gpu_layers=self.n_gpu_layers,
            flash_attn=self.flash_attn,
            verbose=False,
            **extra,
        )
