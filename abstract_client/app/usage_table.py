"""``abstract-client usage``: a gateway's usage as a table — from its database (``--data-dir``)
or from the gateway itself (``--url``, ``GET /v1/usage`` with your key)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

__all__ = ["format_table", "usage_command"]

_COLUMNS = ("day", "key", "model", "outcome", "requests", "prompt_tokens", "cached_tokens", "generated_tokens")
_HEADINGS = ("day", "key", "model", "outcome", "requests", "prompt", "cached", "generated")


def usage_command(args: argparse.Namespace) -> int:
    from ..gateway.team.usage_records import day_of, usage_file
    from ..gateway.team.usage_stores import open_for_reading, usage_rows

    try:
        days = {name: day_of(name, getattr(args, name)) for name in ("start", "end") if getattr(args, name)}
    except ValueError as exc:
        return _usage_error(str(exc))
    if args.url:
        try:
            rows = _fetch(args.url, args.api_key_env, args.key, days)
        except RuntimeError as exc:
            return _usage_error(str(exc))
    else:
        path = usage_file(args.data_dir)
        try:
            db = open_for_reading(path)
        except FileNotFoundError as exc:
            return _usage_error(f"{exc} (a gateway writes it there; --data-dir names another)")
        try:
            rows = usage_rows(db, key=args.key, **days)
        except Exception as exc:  # sqlite3.Error: not a usage database, or a broken one
            return _usage_error(f"cannot read {path}: {exc}")
        finally:
            db.close()
    sys.stdout.write(json.dumps(rows, indent=2) + "\n" if args.json else format_table(rows))
    return 0


def _fetch(url: str, key_env: str | None, key: str | None, days: dict[str, str]) -> list[dict[str, Any]]:
    import httpx

    headers = {}
    if key_env:
        value = os.environ.get(key_env, "").strip()
        if not value:
            raise RuntimeError(f"the key variable {key_env} is unset or empty")
        headers["Authorization"] = f"Bearer {value}"
    params = {**days, **({"key": key} if key else {})}
    try:
        response = httpx.get(url.rstrip("/") + "/v1/usage", params=params, headers=headers, timeout=30)
    except httpx.HTTPError as exc:
        raise RuntimeError(f"cannot reach {url}: {exc}") from None
    if response.status_code != 200:
        try:
            why = response.json()["error"]["message"]
        except Exception:
            why = response.text[:200]
        raise RuntimeError(f"{url} answered {response.status_code}: {why}")
    rows: list[dict[str, Any]] = response.json()["data"]
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    """The rows as aligned columns, with a total line; stopped answers on lines of their own."""
    if not rows:
        return "no usage recorded for this query\n"
    cells = [list(_HEADINGS)] + [[str(row[c]) for c in _COLUMNS] for row in rows]
    totals = ["total", "", "", ""] + [str(sum(int(row[c] or 0) for row in rows)) for c in _COLUMNS[4:]]
    cells.append(totals)
    widths = [max(len(line[i]) for line in cells) for i in range(len(_COLUMNS))]
    numeric = set(range(4, len(_COLUMNS)))

    def line(values: list[str]) -> str:
        return "  ".join(
            v.rjust(w) if i in numeric else v.ljust(w) for i, (v, w) in enumerate(zip(values, widths, strict=True))
        ).rstrip()

    out = [line(cells[0]), line(["-" * w for w in widths])]
    out += [line(values) for values in cells[1:-1]]
    out += [line(["-" * w for w in widths]), line(totals)]
    return "\n".join(out) + "\n"


def _usage_error(message: str) -> int:
    sys.stderr.write(f"error: {message}\n")
    return 2
