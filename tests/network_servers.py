"""Real network components the network tests start: tinyproxy (a forward proxy, Debian's
package), nginx (TLS termination and client certificates) and certificates made by trustme;
and a relay that can go silent (:class:`BlackholingProxy`), the network's silent drop.

Each is a real process on a loopback port, started by the test and stopped after it; none is
faked. When the binary is missing the test fails with the reason (``scripts/test.sh`` installs
both), unless ``ABSTRACT_CLIENT_REQUIRE_ENGINES`` is unset and the machine has neither.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

from .helpers import require_module, wait_until

trustme = require_module("trustme", "dev")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _binary(name: str, *extra: str) -> str:
    for candidate in (name, *extra):
        found = shutil.which(candidate) or (candidate if os.path.exists(candidate) else None)
        if found:
            return found
    pytest.fail(f"{name} is not installed (apt-get install {name}): the network tests need the real one")


def _wait_listening(port: int, proc: subprocess.Popen[bytes], what: str, log: Path) -> None:
    def up() -> bool:
        if proc.poll() is not None:
            return True
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
        return False

    if not wait_until(up, timeout=15) or proc.poll() is not None:
        text = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        proc.kill()
        pytest.fail(f"{what} did not start on port {port}: {text}")


def _end(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)
    if proc.poll() is None:
        proc.kill()


class Tinyproxy:
    """A forward proxy: forwards http requests (absolute-form) and tunnels ``CONNECT``. Its log
    is the evidence of what went through it."""

    def __init__(self, workdir: Path, *, auth: tuple[str, str] | None = None) -> None:
        self.port = free_port()
        self.dir = workdir / f"tinyproxy-{self.port}"
        self.dir.mkdir(parents=True)
        self.log = self.dir / "tinyproxy.log"
        lines = [
            f"Port {self.port}",
            "Listen 127.0.0.1",
            "Timeout 600",
            f'LogFile "{self.log}"',
            "LogLevel Connect",
            "MaxClients 200",
            "Allow 127.0.0.1",
            "DisableViaHeader Yes",
        ]
        if auth:
            lines.append(f"BasicAuth {auth[0]} {auth[1]}")
        conf = self.dir / "tinyproxy.conf"
        conf.write_text("\n".join(lines) + "\n")
        self.proc = subprocess.Popen(
            [_binary("tinyproxy", "/usr/bin/tinyproxy"), "-d", "-c", str(conf)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        _wait_listening(self.port, self.proc, "tinyproxy", self.log)

    def url(self, userinfo: str = "") -> str:
        return f"http://{userinfo + '@' if userinfo else ''}127.0.0.1:{self.port}"

    def requests(self) -> list[str]:
        """``METHOD target`` of every request the proxy read, in order."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return re.findall(r"Request \(file descriptor \d+\): (\S+ \S+) HTTP", text)

    def stop(self) -> None:
        _end(self.proc)


@dataclass
class Certificates:
    """A CA the client may trust, the server's certificate (127.0.0.1, localhost), and a second
    CA that issued a client certificate (for nginx's ``ssl_verify_client``)."""

    ca_pem: Path
    server_pem: Path
    server_key: Path
    client_ca_pem: Path
    client_pem: Path
    client_key: Path

    @classmethod
    def make(cls, workdir: Path) -> Certificates:
        workdir.mkdir(parents=True, exist_ok=True)
        ca = trustme.CA()
        server = ca.issue_cert("127.0.0.1", "localhost")
        client_ca = trustme.CA()
        client = client_ca.issue_cert("client@example.test")
        paths = cls(
            *(workdir / n for n in ("ca.pem", "server.pem", "server.key", "client-ca.pem", "client.pem", "client.key"))
        )
        ca.cert_pem.write_to_path(str(paths.ca_pem))
        server.private_key_pem.write_to_path(str(paths.server_key))
        with open(paths.server_pem, "wb") as f:
            for blob in server.cert_chain_pems:
                f.write(blob.bytes())
        client_ca.cert_pem.write_to_path(str(paths.client_ca_pem))
        client.private_key_pem.write_to_path(str(paths.client_key))
        with open(paths.client_pem, "wb") as f:
            for blob in client.cert_chain_pems:
                f.write(blob.bytes())
        return paths


class Nginx:
    """nginx in front of ``upstream_port`` (a plain HTTP server). With ``certs`` it terminates TLS
    (and with ``client_certs`` requires a client certificate from the client CA:
    ``ssl_verify_client on``); else it listens on plain http. ``location`` replaces the default
    ``location / {...}`` block (streaming unbuffered both ways), with ``{upstream}`` for
    ``127.0.0.1:PORT``. A client that leaves makes nginx close its upstream connection, so the
    upstream's disconnect timestamp is the evidence of a stop."""

    def __init__(
        self,
        workdir: Path,
        certs: Certificates | None,
        upstream_port: int | None,
        *,
        client_certs: bool = False,
        location: str | None = None,
        http_block: str = "",
    ) -> None:
        self.port = free_port()
        self.tls = certs is not None
        self.dir = workdir / f"nginx-{self.port}"
        for sub in ("", "tmp"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        listen = f"listen 127.0.0.1:{self.port}"
        if certs is not None:
            listen += f" ssl; ssl_certificate {certs.server_pem}; ssl_certificate_key {certs.server_key}"
            if client_certs:
                listen += f"; ssl_client_certificate {certs.client_ca_pem}; ssl_verify_client on"
        location = (
            location
            or """location / {
            proxy_pass http://{upstream};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 600s;
        }"""
        )
        location = location.replace("{upstream}", f"127.0.0.1:{upstream_port}")  # (http_block: an upstream {...})
        tmp = self.dir / "tmp"
        conf = f"""
master_process off;
daemon off;
pid {self.dir}/nginx.pid;
error_log {self.dir}/error.log info;
events {{ worker_connections 512; }}
http {{
    access_log {self.dir}/access.log;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    {http_block}
    server {{
        {listen};
        {location}
    }}
}}
"""
        path = self.dir / "nginx.conf"
        path.write_text(conf)
        self.error_log = self.dir / "error.log"
        self.proc = subprocess.Popen(
            [_binary("nginx", "/usr/sbin/nginx"), "-c", str(path), "-p", str(self.dir)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        _wait_listening(self.port, self.proc, "nginx", self.error_log)

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def stop(self) -> None:
        _end(self.proc)


class BlackholingProxy:
    """A TCP relay to ``upstream_port`` on loopback whose ``blackhole()`` makes every connection
    open at that moment go silent both ways (its bytes read and dropped, the sockets left open):
    a NAT or load balancer that forgot a connection. New connections relay as before."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._generation = 0  # a connection relays while its generation is the current one
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, name="blackholing-proxy", daemon=True).start()

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def blackhole(self) -> None:
        with self._lock:
            self._generation += 1

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            with self._lock:
                self._sockets += [client, upstream]
                generation = self._generation
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b, generation), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, generation: int) -> None:
        while True:
            try:
                data = source.recv(65536)
            except OSError:
                return
            if not data:
                with contextlib.suppress(OSError):
                    sink.shutdown(socket.SHUT_WR)
                return
            if generation == self._generation:
                with contextlib.suppress(OSError):
                    sink.sendall(data)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.close()
