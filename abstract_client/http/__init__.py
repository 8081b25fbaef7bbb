"""HTTP plumbing shared by every HTTP lane: the socket guard, clients, decoders, retries."""

__all__: list[str] = []
