"""A key's limits as three steps on its state, sans-io (``limits.py`` decides with them): an
admission, a release, a renewal of the reservations a living process holds. The state is JSON,
so the same steps run on a dict in memory, a row of SQLite and — written again in Lua, the
twin kept beside them here — a Redis value; ``tests/test_limits_steps.py`` runs both twins on the
same random operations and compares every verdict and state.

A key's state: the requests in flight (``f``: ticket -> [expiry ms, tokens reserved]), the last
minute by second (``w``: second -> [requests admitted, tokens settled]), and its budget's period
(``p``: the period's end, ms; ``s``: tokens spent in it).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

__all__ = ["LUA", "STEPS", "WINDOW_S", "admit_step", "fresh_state", "release_step", "renew_step", "sane"]

WINDOW_S = 60


def fresh_state() -> dict[str, Any]:
    return {"f": {}, "w": {}, "p": 0, "s": 0}


def sane(state: Any) -> dict[str, Any]:
    """A state as the steps expect it; anything else (a foreign value) is a fresh one."""
    if not isinstance(state, dict):
        return fresh_state()
    flights, window = state.get("f"), state.get("w")
    period, spent = state.get("p"), state.get("s")
    out = fresh_state()
    if isinstance(flights, dict):
        out["f"] = {
            t: [int(v[0]), int(v[1])]
            for t, v in flights.items()
            if isinstance(v, list) and len(v) == 2 and all(_number(x) for x in v)
        }
    if isinstance(window, dict):
        out["w"] = {
            s: [int(v[0]), int(v[1])]
            for s, v in window.items()
            if s.isdigit() and isinstance(v, list) and len(v) == 2 and all(_number(x) for x in v)
        }
    if isinstance(period, int | float) and isinstance(spent, int | float) and _number(period) and _number(spent):
        out["p"], out["s"] = int(period), int(spent)
    return out


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _prune(state: dict[str, Any], now_ms: int) -> None:
    flights = state["f"]
    for ticket in [t for t, (expiry, _) in flights.items() if expiry <= now_ms]:
        del flights[ticket]
    horizon = now_ms // 1000 - WINDOW_S  # a second at or before it is out of the last minute
    window = state["w"]
    for second in [s for s in window if int(s) <= horizon]:
        del window[second]


def admit_step(
    state: dict[str, Any],
    now_ms: int,
    ticket: str,
    want: int,
    lease_ms: int,
    seed: int,
    period_end_ms: int,
    count_only: bool,
    concurrent: int,
    rpm: int,
    tpm: int,
    budget: int,
) -> list[Any]:
    """One admission, in place on ``state``. Limits are -1 for none. ``[1, "", 0, reserved, 0]``
    admitted, else ``[0, limit, retry_after_s, 0, what_was_counted]``."""
    _prune(state, now_ms)
    if state["p"] < period_end_ms:  # a new period (or a new key: its spending so far is the seed)
        state["s"] = seed if state["p"] == 0 else 0
        state["p"] = period_end_ms
    flights, window = state["f"], state["w"]
    if concurrent >= 0 and len(flights) >= concurrent:
        return [0, "concurrent", 1, 0, len(flights)]
    requests = sum(v[0] for v in window.values())
    if rpm >= 0 and requests >= rpm:
        seconds = sorted(int(s) for s, v in window.items() if v[0] > 0)
        retry = WINDOW_S if not seconds else math.ceil(((seconds[0] + WINDOW_S) * 1000 - now_ms) / 1000)
        return [0, "requests_per_minute", max(1, retry), 0, requests]
    reserved = sum(v[1] for v in flights.values())
    room, tight, counted = -1, "", 0  # what is left, the limit that leaves least, what it counted
    if not count_only:
        if tpm >= 0:
            used = sum(v[1] for v in window.values()) + reserved
            if used >= tpm:
                return [0, "tokens_per_minute", _tokens_free_in(window, used - tpm + 1, now_ms), 0, used]
            room, tight, counted = tpm - used, "tokens_per_minute", used
        if budget >= 0:
            spent = state["s"] + reserved
            if spent >= budget:
                return [0, "token_budget", max(1, math.ceil((state["p"] - now_ms) / 1000)), 0, spent]
            if room < 0 or budget - spent < room:
                room, tight, counted = budget - spent, "token_budget", spent
        # what is left is less than the request may cost: it waits for the requests in flight
        # (one request at a time may take less than it asked: a key's overshoot is at most one
        # request's)
        if room >= 0 and want > room and flights:
            return [0, tight, 1, 0, counted]
    take = 0 if count_only else (want if room < 0 else min(want, room))
    flights[ticket] = [now_ms + lease_ms, take]
    bucket = window.setdefault(str(now_ms // 1000), [0, 0])
    bucket[0] += 1
    return [1, "", 0, take, 0]


def _tokens_free_in(window: dict[str, list[int]], excess: int, now_ms: int) -> int:
    """Seconds until enough settled tokens leave the window (reservations free themselves when
    their requests end: a second, then)."""
    for second in sorted(int(s) for s in window):
        excess -= window[str(second)][1]
        if excess <= 0:
            return max(1, math.ceil(((second + WINDOW_S) * 1000 - now_ms) / 1000))
    return 1


def release_step(state: dict[str, Any], now_ms: int, ticket: str, tokens: int) -> list[Any]:
    """A request ended having cost ``tokens``: its reservation goes, its tokens count."""
    state["f"].pop(ticket, None)
    if tokens > 0:
        bucket = state["w"].setdefault(str(now_ms // 1000), [0, 0])
        bucket[1] += tokens
        if now_ms < state["p"]:
            state["s"] += tokens
    return [1]


def renew_step(state: dict[str, Any], now_ms: int, lease_ms: int, tickets: list[str]) -> list[Any]:
    """The requests of ``tickets`` still run: their reservations hold another lease."""
    flights = state["f"]
    renewed = 0
    for ticket in tickets:
        if ticket in flights:
            flights[ticket][0] = now_ms + lease_ms
            renewed += 1
    return [renewed]


STEPS: dict[str, Callable[..., list[Any]]] = {"admit": admit_step, "release": release_step, "renew": renew_step}

# The same three steps for Redis, on the key's JSON state (KEYS[1]); ARGV[1] the step, then its
# arguments as above (limits -1 for none; renew: now, lease, tickets...). A value that is not a
# state of ours (an operator's edit, another type) is replaced by a fresh state.
LUA = """
local function num(x) return type(x) == 'number' and x == x and x ~= math.huge and x ~= -math.huge end
local function pair(v) return type(v) == 'table' and #v == 2 and num(v[1]) and num(v[2]) end
local raw = redis.pcall('GET', KEYS[1])
local ok, st = false, nil
if type(raw) == 'string' then ok, st = pcall(cjson.decode, raw) end
local s = {f = {}, w = {}, p = 0, s = 0}
if ok and type(st) == 'table' then
  if type(st.f) == 'table' then
    for t, v in pairs(st.f) do if type(t) == 'string' and pair(v) then s.f[t] = {v[1], v[2]} end end
  end
  if type(st.w) == 'table' then
    for k, v in pairs(st.w) do
      if type(k) == 'string' and string.match(k, '^%d+$') and pair(v) then s.w[k] = {v[1], v[2]} end
    end
  end
  if num(st.p) and num(st.s) then s.p, s.s = st.p, st.s end
end
local op, now = ARGV[1], tonumber(ARGV[2])
local sec = math.floor(now / 1000)
local function prune()
  for t, v in pairs(s.f) do if v[1] <= now then s.f[t] = nil end end
  for k, _ in pairs(s.w) do if tonumber(k) <= sec - 60 then s.w[k] = nil end end
end
local function save()
  local n = 0
  for _ in pairs(s.f) do n = n + 1 end
  for _ in pairs(s.w) do n = n + 1 end
  if n == 0 and s.p == 0 then redis.call('DEL', KEYS[1]) return end
  local ttl = math.max(s.p - now, 0) + 86400000
  redis.call('SET', KEYS[1], cjson.encode(s), 'PX', math.floor(ttl))
end
local function sorted_seconds(requests_only)
  local out = {}
  for k, v in pairs(s.w) do if (not requests_only) or v[1] > 0 then out[#out + 1] = tonumber(k) end end
  table.sort(out)
  return out
end
local result
if op == 'admit' then
  local ticket, want, lease = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
  local seed, pend, count_only = tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8] == '1'
  local concurrent, rpm, tpm, budget = tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[12])
  prune()
  if s.p < pend then
    if s.p == 0 then s.s = seed else s.s = 0 end
    s.p = pend
  end
  local inflight, reserved, requests, wtokens = 0, 0, 0, 0
  for _, v in pairs(s.f) do inflight = inflight + 1; reserved = reserved + v[2] end
  for _, v in pairs(s.w) do requests = requests + v[1]; wtokens = wtokens + v[2] end
  if concurrent >= 0 and inflight >= concurrent then
    result = {0, 'concurrent', 1, 0, inflight}
  elseif rpm >= 0 and requests >= rpm then
    local secs = sorted_seconds(true)
    local retry = 60
    if #secs > 0 then retry = math.ceil(((secs[1] + 60) * 1000 - now) / 1000) end
    result = {0, 'requests_per_minute', math.max(1, retry), 0, requests}
  else
    local room, tight, counted = -1, '', 0
    if not count_only and tpm >= 0 then
      local used = wtokens + reserved
      if used >= tpm then
        local excess, retry = used - tpm + 1, 1
        for _, k in ipairs(sorted_seconds(false)) do
          excess = excess - s.w[tostring(k)][2]
          if excess <= 0 then retry = math.max(1, math.ceil(((k + 60) * 1000 - now) / 1000)) break end
        end
        result = {0, 'tokens_per_minute', retry, 0, used}
      else
        room, tight, counted = tpm - used, 'tokens_per_minute', used
      end
    end
    if result == nil and not count_only and budget >= 0 then
      local spent = s.s + reserved
      if spent >= budget then
        result = {0, 'token_budget', math.max(1, math.ceil((s.p - now) / 1000)), 0, spent}
      elseif room < 0 or budget - spent < room then
        room, tight, counted = budget - spent, 'token_budget', spent
      end
    end
    if result == nil and not count_only and room >= 0 and want > room and inflight > 0 then
      result = {0, tight, 1, 0, counted}
    end
    if result == nil then
      local take = want
      if count_only then take = 0 elseif room >= 0 then take = math.min(want, room) end
      s.f[ticket] = {now + lease, take}
      local b = s.w[tostring(sec)] or {0, 0}
      b[1] = b[1] + 1
      s.w[tostring(sec)] = b
      result = {1, '', 0, take, 0}
    end
  end
elseif op == 'release' then
  local ticket, tokens = ARGV[3], tonumber(ARGV[4])
  s.f[ticket] = nil
  if tokens > 0 then
    local b = s.w[tostring(sec)] or {0, 0}
    b[2] = b[2] + tokens
    s.w[tostring(sec)] = b
    if now < s.p then s.s = s.s + tokens end
  end
  result = {1}
else
  local lease, renewed = tonumber(ARGV[3]), 0
  for i = 4, #ARGV do
    local v = s.f[ARGV[i]]
    if v then v[1] = now + lease; renewed = renewed + 1 end
  end
  result = {renewed}
end
save()
return result
"""
