"""Process memory for the in-process lanes whose weights live in ordinary process memory
(transformers on a CPU, llama.cpp): RSS, giving freed memory back to the OS, and the eject report
built from them."""

from __future__ import annotations

import ctypes
import gc
import os
import sys
from typing import Any

from abstract_client.provider import UnloadReport

__all__ = ["give_memory_back", "rss_bytes", "unload_measuring_rss"]


def rss_bytes() -> int:
    """This process's resident memory now (Linux: ``/proc/self/statm``; elsewhere the peak, which
    is all ``getrusage`` knows)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak if sys.platform == "darwin" else peak * 1024)


def give_memory_back() -> None:
    """``gc.collect()``, then glibc's ``malloc_trim(0)``: freed memory returns to the OS instead
    of staying in malloc's arenas (without it RSS barely moves after an eject)."""
    gc.collect()
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):  # musl or no glibc: nothing to trim with
            pass


def unload_measuring_rss(lane: str, handle: Any) -> UnloadReport:
    """Eject on the engine thread, idle: ``handle.drop()``, with process RSS before and after and
    the baseline the handle took before its load (``handle.rss_baseline``)."""
    before = rss_bytes()
    handle.drop()
    after = rss_bytes()
    return UnloadReport(
        server_unloaded=True,
        memory_before=before,
        memory_after=after,
        extra={"memory_baseline": handle.rss_baseline},
        detail=f"{lane}: process RSS {before / 2**20:.0f} MiB → {after / 2**20:.0f} MiB",
    )
