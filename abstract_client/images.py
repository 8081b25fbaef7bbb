"""Images in messages: one form in, each backend's form out, limits checked before anything is sent.

A caller puts an image in a message as an OpenAI content part,
``{"type": "image_url", "image_url": {"url": ...}}``, where ``url`` is

* a ``data:image/...;base64,...`` URL,
* a local file, as a path (``/tmp/cat.png``, ``~/cat.jpg``) or a ``file://`` URL,
* an ``http(s)://`` URL — passed on as it is; only the ``/v1`` wires take it (the server
  fetches it); Ollama, LM Studio's native API and the in-process lanes refuse it
  (:class:`~abstract_client.errors.NotSupportedError`), since this library never fetches a URL.

:func:`image_part` builds such a part from a path or bytes. At the call boundary
(:func:`resolve_images`) every local file becomes a data URL, and the limits are checked —
:class:`ImageLimits`, per call: bytes per image (default 20 MiB, the decoded size) and images
per call (default 16) — so an image over a limit, an unreadable file or a data URL that is not
base64 of an image is an :class:`~abstract_client.errors.ImageInputError` (a ``ValueError``)
before anything is held or sent. The lanes then only map data URLs to their wire
(:func:`decode_data_url`).
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import mimetypes
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse, urlsplit

from .errors import ImageInputError, NotSupportedError
from .types import ContentPart, Message

__all__ = [
    "DEFAULT_MAX_IMAGES",
    "DEFAULT_MAX_IMAGE_BYTES",
    "ImageLimits",
    "decode_data_url",
    "has_images",
    "image_part",
    "image_urls",
    "resolve_images",
    "url_refused",
]

DEFAULT_MAX_IMAGE_BYTES = 20 * 2**20
DEFAULT_MAX_IMAGES = 16

# the formats every image-taking backend here reads, by their first bytes
_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"BM", "image/bmp"),
)


@dataclass(frozen=True, slots=True)
class ImageLimits:
    """What one call may carry: ``max_bytes`` per image (decoded), ``max_images`` in all;
    ``local_files=False`` refuses paths and ``file://`` URLs (the gateway: a client must never
    make it read the gateway host's files). An http(s) URL on a link-local address or a cloud
    metadata name (``169.254.169.254``, ``fe80::…``, ``metadata.google.internal``) is always
    refused: a server that fetches image URLs (vLLM does) would fetch it for the caller;
    ``private_urls=False`` refuses loopback and private addresses too (the gateway's default).
    Names are not resolved: a name is judged as written."""

    max_bytes: int = DEFAULT_MAX_IMAGE_BYTES
    max_images: int = DEFAULT_MAX_IMAGES
    local_files: bool = True
    private_urls: bool = True

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_images"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, not {value!r}")


def sniff_mime(data: bytes) -> str | None:
    """The image type of ``data`` by its first bytes (PNG, JPEG, GIF, BMP, WebP), or None."""
    for magic, mime in _MAGIC:
        if data.startswith(magic):
            return mime
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def image_part(source: str | os.PathLike[str] | bytes, *, mime: str | None = None) -> ContentPart:
    """An image content part: ``source`` is a local file, image bytes, or a URL (kept as is)."""
    if isinstance(source, bytes):
        kind = mime or sniff_mime(source)
        if kind is None:
            raise ImageInputError("these bytes are not a PNG, JPEG, GIF, BMP or WebP image: pass mime=")
        return _part(_data_url(kind, source))
    text = os.fspath(source)
    if text.startswith(("data:", "http://", "https://", "file://")):
        return _part(text)
    return _part(str(Path(text).expanduser().resolve()))


def has_images(messages: list[Message]) -> bool:
    """Whether any message carries an image part."""
    return any(True for _ in image_urls(messages))


def image_urls(messages: list[Message]) -> Any:
    """Every image part's URL, in order."""
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            for part in content:
                if part.get("type") == "image_url":
                    yield _url_of(part)


def resolve_images(messages: list[Message], limits: ImageLimits) -> list[Message]:
    """The messages with every local image read into a data URL, every limit checked (a new
    list where anything changed; the caller's messages are never modified)."""
    count = 0
    out: list[Message] = []
    for i, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list) or not any(p.get("type") == "image_url" for p in content):
            out.append(message)
            continue
        parts: list[ContentPart] = []
        for j, part in enumerate(content):
            if part.get("type") != "image_url":
                parts.append(part)
                continue
            count += 1
            if count > limits.max_images:
                raise ImageInputError(f"more than {limits.max_images} images in one call (max_images)")
            where = f"messages[{i}]['content'][{j}]"
            url = _url_of(part, where)
            if url.startswith(("http://", "https://")):
                check_image_url(url, limits, where)
                parts.append(part)
                continue
            if not url.startswith("data:") and not limits.local_files:
                raise ImageInputError(f"{where}: images must be data URLs or http(s) URLs here, not files")
            mime, data = decode_data_url(url, where) if url.startswith("data:") else _read_file(url, where, limits)
            if sniff_mime(data) is None:
                raise ImageInputError(f"{where}: the data is not a PNG, JPEG, GIF, BMP or WebP image")
            if len(data) > limits.max_bytes:
                raise ImageInputError(f"{where}: the image is {len(data):,} bytes, over max_bytes={limits.max_bytes:,}")
            if not url.startswith("data:"):
                image_url = {**dict(part.get("image_url") or {}), "url": _data_url(mime, data)}
                part = {**part, "image_url": image_url}
            parts.append(part)
        out.append({**message, "content": parts})
    return out


_METADATA_NAMES = frozenset({"metadata.google.internal", "metadata", "instance-data", "instance-data.ec2.internal"})
_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


def check_image_url(url: str, limits: ImageLimits, where: str = "an image") -> None:
    """Refuse an image URL a fetching server must not be sent to (see :class:`ImageLimits`)."""
    try:
        host = (urlsplit(url).hostname or "").rstrip(".").lower()
    except ValueError:
        raise ImageInputError(f"{where}: the image URL is malformed") from None
    if not host:
        raise ImageInputError(f"{where}: the image URL has no host")
    try:
        address: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if host in _METADATA_NAMES or (address is not None and (address.is_link_local or address == _EC2_V6_METADATA)):
        raise ImageInputError(f"{where}: an image URL on a link-local or metadata address is refused ({host})")
    if limits.private_urls:
        return
    private = host in _LOOPBACK_NAMES or host.endswith(".localhost")
    if address is not None:
        private = address.is_private or address.is_loopback or address.is_reserved or address.is_unspecified
        private = private or (isinstance(address, ipaddress.IPv4Address) and address in _SHARED_V4)
    if private:
        raise ImageInputError(
            f"{where}: an image URL on a loopback or private address is refused here ({host}; "
            "the gateway's private_image_urls setting allows it)"
        )


_EC2_V6_METADATA = ipaddress.IPv6Address("fd00:ec2::254")
_SHARED_V4 = ipaddress.IPv4Network("100.64.0.0/10")  # carrier-grade NAT (and Alibaba's metadata at 100.100.100.200)


def decode_data_url(url: str, where: str = "an image") -> tuple[str, bytes]:
    """``(mime type, bytes)`` of a ``data:image/...;base64,`` URL; anything else is an
    :class:`ImageInputError`."""
    head, sep, payload = url.partition(",")
    if not sep or not head.startswith("data:") or not head.endswith(";base64"):
        raise ImageInputError(f"{where}: a data URL must look like data:image/png;base64,...")
    mime = head[5:-7] or "application/octet-stream"
    if not mime.startswith("image/"):
        raise ImageInputError(f"{where}: {mime!r} is not an image type")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ImageInputError(f"{where}: the data URL's payload is not valid base64") from None
    return mime, data


def url_refused(messages: list[Message], lane: str) -> str | None:
    """Why ``lane`` refuses these messages' first image URL (for wires and engines that take
    image data only), or None when they have none."""
    url = next((u for u in image_urls(messages) if u.startswith(("http://", "https://"))), None)
    if url is None:
        return None
    return (
        f"the {lane} lane takes images as data or files, not URLs: fetch {url[:80]!r} yourself "
        "(abstract_client.image_part(bytes)) — this library never fetches a URL"
    )


def base64_payload(part: Mapping[str, Any], lane: str) -> tuple[str, str]:
    """``(mime, base64 text)`` of a resolved image part, for wires that take base64 only; an
    ``http(s)`` URL is a :class:`NotSupportedError` naming the lane (nothing is fetched here)."""
    url = _url_of(part)
    if not url.startswith("data:"):
        raise NotSupportedError(url_refused([{"role": "user", "content": [_part(url)]}], lane) or url, provider=lane)
    head, _, payload = url.partition(",")
    return head[5:-7], payload


def _url_of(part: Mapping[str, Any], where: str = "an image part") -> str:
    image_url = part.get("image_url")
    url = image_url.get("url") if isinstance(image_url, Mapping) else image_url
    if not isinstance(url, str) or not url:
        raise ImageInputError(f"{where}: an image_url part needs image_url={{'url': ...}}")
    return url


def _read_file(url: str, where: str, limits: ImageLimits) -> tuple[str, bytes]:
    path = Path(unquote(urlparse(url).path) if url.startswith("file://") else url).expanduser()
    try:
        size = path.stat().st_size
        if size > limits.max_bytes:  # refused before it is read
            raise ImageInputError(f"{where}: {path} is {size:,} bytes, over max_bytes={limits.max_bytes:,}")
        data = path.read_bytes()
    except OSError as exc:
        raise ImageInputError(f"{where}: cannot read the image {path}: {exc.strerror or exc}") from None
    mime = sniff_mime(data) or mimetypes.guess_type(path.name)[0]
    if mime is None or not mime.startswith("image/"):
        raise ImageInputError(f"{where}: {path} is not a PNG, JPEG, GIF, BMP or WebP image")
    return mime, data


def _data_url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def _part(url: str) -> ContentPart:
    return {"type": "image_url", "image_url": {"url": url}}
