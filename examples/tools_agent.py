"""An agent turn with tools, a Stop in the middle of a tool call, and the next turn that still
goes through (the truncated call is never sent back).

python examples/tools_agent.py                          # against the bundled fake (vLLM wire)
python examples/tools_agent.py vllm http://127.0.0.1:8000 smollm2
"""

from __future__ import annotations

import sys
import threading

from abstract_client import LLM, GenerationCancelledError, Message, continue_after, create_llm
from abstract_client.testing import FakeOpenAIServer


def get_weather(city: str) -> str:
    """Current weather in a city."""
    return f"sunny in {city}"


def get_time(tz: str) -> str:
    """Current time in a time zone."""
    return f"12:00 in {tz}"


TOOLS = {"get_weather": get_weather, "get_time": get_time}


def agent_turn(llm: LLM, messages: list[Message], stop: threading.Event) -> list[Message]:
    """One turn: stream the answer; run the tools it calls; on a stop, keep what is consistent."""
    try:
        with llm.stream(messages=messages, tools=list(TOOLS.values()), cancel_event=stop) as stream:
            for chunk in stream:
                if chunk.tool_call is not None and chunk.tool_call.name:
                    print(f"  model is calling {chunk.tool_call.name}...")
                    if chunk.tool_call.index == 1:
                        stop.set()  # the user presses Stop while the second call is being written
        result = stream.result()
    except GenerationCancelledError as err:
        kept = [c.name for c in err.tool_calls]
        dropped = err.partial_tool_call.name if err.partial_tool_call else None
        print(f"  [stopped] complete calls kept: {kept}; call being written dropped: {dropped}")
        return continue_after(messages, err, unrun_tool_answer="not run: the user stopped the turn")
    history = continue_after(messages, result)
    for call in result.tool_calls:
        history.append({"role": "tool", "tool_call_id": call.id, "content": TOOLS[call.name](**call.arguments)})
    return history


def main() -> None:
    if len(sys.argv) == 4:
        with create_llm(sys.argv[1], sys.argv[3], base_url=sys.argv[2]) as llm:
            print(agent_turn(llm, [{"role": "user", "content": "Weather and time in Paris?"}], threading.Event()))
        return
    with FakeOpenAIServer(token_delay=0.02) as server:
        server.behavior.script = [
            {"tool": 0, "id": "call_1", "name": "get_weather", "arguments": '{"city": '},
            {"tool": 0, "arguments": '"Paris"}'},
            {"tool": 1, "id": "call_2", "name": "get_time", "arguments": '{"tz": "Europe/'},
            {"tool": 1, "arguments": 'Paris"}'},
        ]
        with create_llm("vllm", "fake-model", base_url=server.base_url) as llm:
            history = agent_turn(llm, [{"role": "user", "content": "Weather and time in Paris?"}], threading.Event())
            server.behavior.script = None
            server.behavior.answer = "It is sunny in Paris."
            history.append({"role": "user", "content": "Just the weather then."})
            print("  next turn:", llm.generate(messages=history).content)


if __name__ == "__main__":
    main()
