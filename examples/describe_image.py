"""One image part, every backend: the library turns it into each server's own form.

python examples/describe_image.py                               # three lanes against bundled fakes
python examples/describe_image.py ollama http://127.0.0.1:11434 llava photo.jpg
python examples/describe_image.py llamacpp http://127.0.0.1:8080 any photo.jpg   # needs --mmproj
python examples/describe_image.py mlx - /path/to/mlx-vlm-model photo.jpg         # pip install '.[vlm]'
"""

from __future__ import annotations

import sys

from abstract_client import LLM, AbortSignal, GenerationCancelledError, NotSupportedError, create_llm, image_part
from abstract_client.testing import FakeLMStudioServer, FakeOllamaServer, FakeOpenAIServer

# a 1x1 red PNG: enough for a wire (a real model wants a real picture)
RED_DOT = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010802000000907753de0000000c49444154"
    "789c63f8cfc000000301010018dd8db00000000049454e44ae426082"
)


def describe(llm: LLM, image: object) -> None:
    """Application code: the same message for every backend."""
    question = [{"role": "user", "content": [{"type": "text", "text": "What is in this picture?"}, image]}]
    try:
        result = llm.generate(messages=question, max_tokens=60, signal=AbortSignal.timeout(30))
        print(f"[{llm.provider_name}] {result.content[:70]!r}")
    except GenerationCancelledError as err:
        print(f"[{llm.provider_name}] stopped ({err.reason}) with {err.partial_text!r}")
    except NotSupportedError as err:
        print(f"[{llm.provider_name}] refused before sending: {err.message}")


def main() -> None:
    if len(sys.argv) == 5:
        lane, url, model, path = sys.argv[1:]
        with create_llm(lane, model, base_url=None if url == "-" else url) as llm:
            describe(llm, image_part(path))
        return
    with FakeOpenAIServer() as v1, FakeOllamaServer() as ollama, FakeLMStudioServer() as lmstudio:
        for lane, server in (("openai-compatible", v1), ("ollama", ollama), ("lmstudio", lmstudio)):
            with create_llm(
                lane, "fake-model", base_url=server.url if lane != "openai-compatible" else v1.base_url
            ) as llm:
                describe(llm, image_part(RED_DOT))
            received = [r for r in server.requests() if r.method == "POST"][-1]
            print(f"  the server received {received.path} with images {[len(i) for i in received.images]} bytes")
        with create_llm("ollama", "fake-model", base_url=ollama.url) as llm:
            describe(llm, image_part("https://example.com/cat.png"))  # Ollama takes data only


if __name__ == "__main__":
    main()
