"""Every way a host says "stop", made into one :class:`~abstract_client.stopping.token.StopToken`
per request: ``token`` (the token, its ordered stop protocol, the calls in flight), ``abort``
(``AbortController``/``AbortSignal``), ``event_hook`` (a ``threading.Event`` set → a callback in
the setting thread, no polling), ``timer`` (``AbortSignal.timeout`` deadlines), ``_loop`` (calling
into asyncio or trio from any thread)."""

__all__: list[str] = []
