"""``abstract-client bench stop``: what a Stop does today with the clients people pick —
openai-python, the anthropic SDK, LiteLLM, LangChain, pydantic-ai, LlamaIndex, ollama-python,
AbstractCore — each stopped by its own best documented way, and the same clients given this
library, on a real llama-server and vLLM and the bundled Ollama and LM Studio fakes. Every
"stopped" is the server's own evidence. See docs/stop-bench.md.

``run.py`` plans and measures, ``servers.py`` reads each server's evidence, ``drive.py`` and
``peers/`` run in the peers' own venv (``venvs.py``), ``report.py`` writes the table and chart.
"""
