"""What a generation's output becomes, sans-io: structured output and tool specs
(``structured``), tool-call assembly from pieces and the constrained-output fallback
(``tool_calls``, ``fallback``), reasoning/tool tag splitting for in-process engines (``tags``),
stop sequences (``stop_sequences``), and the next turn's history (``history``)."""

__all__: list[str] = []
