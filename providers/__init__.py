"""One module per backend. Each is wire mapping plus the engine's own stop hook, nothing else."""

__all__: list[str] = []
