"""The load benchmark's floor: a bare pass-through, bytes from the client to the upstream and
back over one upstream connection per client connection, no HTTP parsing at all; a client that
closes closes its upstream. Any gateway that parses HTTP and JSON costs more than this.

    python benchmarks/_relay.py UPSTREAM_URL   # prints its own base URL
"""

from __future__ import annotations

import asyncio
import sys
from urllib.parse import urlsplit


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


async def main(upstream: str) -> None:
    parts = urlsplit(upstream)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(host, port)
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024)
    print(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}{parts.path}", flush=True)
    await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
