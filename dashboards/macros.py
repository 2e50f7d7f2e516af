"""Expand the Grafana ClickHouse plugin's macros and Grafana template variables in panel SQL.

Grafana sends a panel's SQL to the grafana-clickhouse-datasource plugin after two rewrites: Grafana
substitutes template variables (``$model``, ``${route:singlequote}``), then the plugin expands its
macros (``$__timeFilter(col)``, ``$__timeInterval(col)``, ...). This module does the same two steps,
producing the text the plugin (v4) would send, so a test can run every panel against real
ClickHouse without Grafana. Expansions follow the plugin's ``pkg/macros/macros.go``:

================================  ==============================================================
``$__timeFilter(c)``              ``c >= toDateTime(FROM) AND c <= toDateTime(TO)`` (unix seconds)
``$__timeFilter_ms(c)``           same with ``fromUnixTimestamp64Milli(ms)``
``$__dateFilter(c)``              ``c >= toDate('YYYY-MM-DD') AND c <= toDate(...)``
``$__timeInterval(c)``            ``toStartOfInterval(toDateTime(c), INTERVAL N second)``
``$__timeInterval_ms(c)``         ``toStartOfInterval(toDateTime64(c, 3), INTERVAL N millisecond)``
``$__interval_s``                 ``N`` (the panel interval in seconds, at least 1)
``$__fromTime`` / ``$__toTime``   ``toDateTime(FROM)`` / ``toDateTime(TO)``
``$__fromTime_ms`` / ``_ms``      ``fromUnixTimestamp64Milli(ms)``
================================  ==============================================================

Anything else spelled ``$__name`` raises ``UnknownMacro``: a dashboard must not rely on a macro
this helper (and so the test) does not understand. Unknown template variables raise too.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any


class UnknownMacro(ValueError):
    """A ``$__macro`` or ``$variable`` this helper cannot expand."""


@dataclass(frozen=True)
class TimeRange:
    """The dashboard time picker's range (UTC) and the panel interval Grafana would compute."""

    start: datetime
    end: datetime
    interval_s: float = 60.0

    def for_panel(self, panel: Mapping[str, Any]) -> TimeRange:
        """The range as this panel sees it: Grafana raises the interval to the panel's minimum
        (``"interval": "1m"``), never lowers it."""
        minimum = duration_s(panel.get("interval") or "")
        return TimeRange(self.start, self.end, max(self.interval_s, minimum))

    @classmethod
    def from_unix(cls, start: float, end: float, interval_s: float = 60.0) -> TimeRange:
        return cls(
            datetime.fromtimestamp(start, tz=timezone.utc),
            datetime.fromtimestamp(end, tz=timezone.utc),
            interval_s,
        )


_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def duration_s(text: str) -> float:
    """A Grafana duration (``"30s"``, ``"1m"``, ``"1h"``) in seconds; empty text is 0."""
    if not text:
        return 0.0
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)", text.strip())
    if not match:
        raise UnknownMacro(f"interval {text!r} is not a Grafana duration like 30s or 1m")
    return float(match[1]) * _UNITS[match[2]]


def _seconds(t: datetime) -> int:
    return int(t.timestamp())


def _millis(t: datetime) -> int:
    return int(round(t.timestamp() * 1000))


def _one_arg(name: str, args: list[str]) -> str:
    if len(args) != 1 or not args[0]:
        raise UnknownMacro(f"$__{name} expects 1 argument, got {len(args)}")
    return args[0]


def _macro(name: str, args: list[str] | None, tr: TimeRange) -> str:
    """The expansion of one macro (``args`` is None when it was written without parentheses)."""
    frm, to = tr.start, tr.end
    interval = max(int(math.floor(tr.interval_s)), 1)
    if name in ("fromTime", "toTime", "fromTime_ms", "toTime_ms", "interval_s"):
        if args is not None:
            raise UnknownMacro(f"$__{name} takes no arguments")
        return {
            "fromTime": f"toDateTime({_seconds(frm)})",
            "toTime": f"toDateTime({_seconds(to)})",
            "fromTime_ms": f"fromUnixTimestamp64Milli({_millis(frm)})",
            "toTime_ms": f"fromUnixTimestamp64Milli({_millis(to)})",
            "interval_s": str(interval),
        }[name]
    if args is None:
        raise UnknownMacro(f"$__{name} needs arguments")
    if name == "timeFilter":
        c = _one_arg(name, args)
        return f"{c} >= toDateTime({_seconds(frm)}) AND {c} <= toDateTime({_seconds(to)})"
    if name == "timeFilter_ms":
        c = _one_arg(name, args)
        return f"{c} >= fromUnixTimestamp64Milli({_millis(frm)}) AND {c} <= fromUnixTimestamp64Milli({_millis(to)})"
    if name == "dateFilter":
        c = _one_arg(name, args)
        return f"{c} >= toDate('{frm:%Y-%m-%d}') AND {c} <= toDate('{to:%Y-%m-%d}')"
    if name == "timeInterval":
        c = _one_arg(name, args)
        return f"toStartOfInterval(toDateTime({c}), INTERVAL {interval} second)"
    if name == "timeInterval_ms":
        c = _one_arg(name, args)
        ms = max(int(tr.interval_s * 1000), 1)
        return f"toStartOfInterval(toDateTime64({c}, 3), INTERVAL {ms} millisecond)"
    raise UnknownMacro(f"unknown macro $__{name}")


def _split_args(text: str) -> list[str]:
    """Split macro arguments on top-level commas (``f(a, b)`` inside an argument stays whole)."""
    args, depth, current = [], 0, []
    for ch in text:
        if ch == "," and depth == 0:
            args.append("".join(current).strip())
            current = []
            continue
        depth += ch == "("
        depth -= ch == ")"
        current.append(ch)
    args.append("".join(current).strip())
    return [] if args == [""] else args


_MACRO_NAME = re.compile(r"\$__(\w+)")


def expand_macros(sql: str, time_range: TimeRange) -> str:
    """Expand every ``$__macro`` / ``$__macro(args)`` in ``sql``."""
    out: list[str] = []
    pos = 0
    while (m := _MACRO_NAME.search(sql, pos)) is not None:
        out.append(sql[pos : m.start()])
        name, end = m[1], m.end()
        args: list[str] | None = None
        if end < len(sql) and sql[end] == "(":
            depth, i = 0, end
            while i < len(sql):
                depth += sql[i] == "("
                depth -= sql[i] == ")"
                if depth == 0:
                    break
                i += 1
            else:
                raise UnknownMacro(f"unbalanced parentheses after $__{name}")
            # Macros may themselves appear inside arguments ($__timeInterval(...) rarely nests, but
            # expanding the inside first costs nothing and matches the plugin's outcome).
            args = [expand_macros(a, time_range) for a in _split_args(sql[end + 1 : i])]
            end = i + 1
        out.append(_macro(name, args, time_range))
        pos = end
    out.append(sql[pos:])
    return "".join(out)


def _quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _format(values: Sequence[str], fmt: str | None) -> str:
    """Grafana's variable formats that SQL dashboards use."""
    if fmt in (None, "singlequote", "sqlstring"):
        # Grafana's SQL data sources quote multi-value variables by default.
        return ",".join(_quote(v) for v in values) if (fmt or len(values) != 1) else values[0]
    if fmt == "csv":
        return ",".join(values)
    if fmt == "raw":
        return ",".join(values)
    if fmt == "doublequote":
        return ",".join('"' + v.replace('"', '\\"') + '"' for v in values)
    raise UnknownMacro(f"unsupported variable format :{fmt}")


_VARIABLE = re.compile(r"\$\{(\w+)(?::(\w+))?\}|\[\[(\w+)\]\]|\$(?!__)([A-Za-z_]\w*)")


def expand_variables(sql: str, variables: Mapping[str, Sequence[str]]) -> str:
    """Substitute template variables (``$v``, ``${v}``, ``${v:singlequote}``, ``[[v]]``).

    ``variables`` maps a name to its selected values (``All`` already resolved to every value).
    Grafana's global ``$__`` variables are macros here and are left for ``expand_macros``.
    """

    def replace(m: re.Match[str]) -> str:
        name = m[1] or m[3] or m[4]
        if name not in variables:
            raise UnknownMacro(f"unknown template variable ${name}")
        return _format(list(variables[name]), m[2])

    return _VARIABLE.sub(replace, sql)


def expand(sql: str, time_range: TimeRange, variables: Mapping[str, Sequence[str]] | None = None) -> str:
    """Template variables first, then the plugin's macros: the order Grafana applies them in."""
    return expand_macros(expand_variables(sql, variables or {}), time_range)


# --- reading dashboards ---------------------------------------------------------------------------

def iter_panels(dashboard: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel with queries, including those nested in collapsed rows."""
    for panel in dashboard.get("panels", []):
        if panel.get("type") == "row":
            yield from (p for p in panel.get("panels", []) if p.get("targets"))
        elif panel.get("targets"):
            yield panel


def annotation_queries(dashboard: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The dashboard's SQL annotation queries (each with its ``target``)."""
    return [a for a in dashboard.get("annotations", {}).get("list", []) if a.get("target", {}).get("rawSql")]


def query_variables(dashboard: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The dashboard's template variables, in declaration order."""
    return list(dashboard.get("templating", {}).get("list", []))


def variable_sql(variable: Mapping[str, Any]) -> str:
    """The SQL of a ``query`` variable (a plain string, or the plugin's ``{rawSql: ...}`` object)."""
    query = variable.get("query")
    if isinstance(query, Mapping):
        return str(query.get("rawSql", ""))
    return str(query or variable.get("definition", ""))


__all__ = [
    "TimeRange",
    "UnknownMacro",
    "expand",
    "expand_macros",
    "expand_variables",
    "iter_panels",
    "query_variables",
    "variable_sql",
]
