"""The server side of HTTP: the gateway's HTTP/1.1 protocol (``protocol.py``), where a client's
departure is learned (``departures.py``) and a reader that stopped reading is seen (``stall.py``),
the outermost middleware (``auth.py``: request id, key, body limits) and the browser policy
(``browsers.py``), reading a request (``reading.py``, ``json_parse.py``), writing to a client
(``client_writes.py``, ``frame_writer.py``, ``reader_stream.py``) and the error answers in each
route's shape (``error_answers.py``)."""

__all__: list[str] = []
