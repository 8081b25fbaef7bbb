"""The same application code on a local and a remote backend: only create_llm changes.

python examples/swap_backends.py                       # both lanes against bundled fakes
python examples/swap_backends.py llamacpp http://127.0.0.1:8080 any
python examples/swap_backends.py ollama http://127.0.0.1:11434 llama3.2
"""

from __future__ import annotations

import sys

from abstract_client import LLM, AbortSignal, GenerationCancelledError, create_llm
from abstract_client.testing import FakeOllamaServer, FakeOpenAIServer


def ask(llm: LLM) -> None:
    """Application code: knows nothing about the backend."""
    try:
        result = llm.generate("Summarise the plot of Hamlet.", max_tokens=400, signal=AbortSignal.timeout(0.3))
        print(f"[{llm.provider_name}] {result.content[:60]}...")
    except GenerationCancelledError as err:
        print(f"[{llm.provider_name}] stopped after 0.3 s ({err.reason}); nothing left running on the server")


def main() -> None:
    if len(sys.argv) == 4:
        ask(create_llm(sys.argv[1], sys.argv[3], base_url=sys.argv[2]))
        return
    with FakeOpenAIServer(token_delay=0.01) as remote, FakeOllamaServer(token_delay=0.01) as local:
        for llm in (
            create_llm("openai-compatible", "fake-model", base_url=remote.base_url),
            create_llm("ollama", "fake-model", base_url=local.base_url),
        ):
            with llm:
                ask(llm)


if __name__ == "__main__":
    main()
