"""The floor for the cost side: the standard library's ``http.client`` reading the same stream
line by line (no client library at all). It has no way to stop and no rows of its own."""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit

from ..kit import Call, Press, Trial

PACKAGES: tuple[str, ...] = ()
SERVERS: tuple[str, ...] = ()


def own(t: Trial) -> Call:
    where = urlsplit(t.url)
    connection = http.client.HTTPConnection(where.hostname or "127.0.0.1", where.port)
    body = {"model": t.model, "messages": t.messages, "max_tokens": t.max_tokens, "stream": t.stream}

    def call(p: Press) -> str:
        connection.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        if not t.stream:
            return str(json.loads(response.read())["choices"][0]["message"]["content"])
        for line in response:
            if line.startswith(b"data: {"):
                p.text.append(json.loads(line[6:])["choices"][0]["delta"].get("content") or "")
        return "".join(p.text)

    return call
