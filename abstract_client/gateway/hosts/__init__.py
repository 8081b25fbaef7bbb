"""Several processes and hosts serving as one: ``--workers N`` on one port and the relay to the
worker that holds a request (``workers.py``), the Redis store several hosts share (``store.py``),
and the background responses kept there, readable and cancellable from any host
(``shared_background.py``)."""

__all__: list[str] = []
