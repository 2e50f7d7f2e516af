"""Figures and the BENCHMARKS.md they make.

A figure is measured in one run against a stated baseline (or target) on a named machine, so the
file says what was measured where, and which targets are not met yet. ``write_benchmarks`` merges
figures into BENCHMARKS.md by section, so `entroloop bench sinks` updates only its own rows and
`entroloop bench all` rewrites everything.
"""

from __future__ import annotations

import json
import os
import platform
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass
class Figure:
    section: str
    name: str
    value: float | None
    unit: str
    target: str = ""
    met: bool | None = None
    baseline: str = ""
    note: str = ""
    runs: int = 1  # the value is the median of this many runs ...
    spread: str = ""  # ... which ranged over this ("low–high"; see entroloop.benchmarks.repeats)
    load_average: float | None = None  # 1-minute load average seen while measuring

    @classmethod
    def repeated(cls, section: str, name: str, measured, unit: str, **kwargs) -> Figure:
        """A figure from a :class:`~entroloop.benchmarks.repeats.Repeated` measurement."""
        return cls(
            section, name, measured.median, unit, runs=measured.runs, spread=measured.spread(),
            load_average=round(measured.load_average, 2), **kwargs,
        )

    def cell(self) -> str:
        if self.value is None:
            return "n/a"
        v = self.value
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"


def cpu_name(cpuinfo: str) -> str | None:
    """The first CPU's model name from ``/proc/cpuinfo``'s text, with its family and model numbers.

    Under a hypervisor the name is often only the vendor's line ("AMD EPYC"), the same for CPUs
    generations apart: the numbers tell such hosts apart, and their figures do not compare."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            break  # the first processor's block ends here
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    name = fields.get("model name")
    if not name:
        return None
    numbers = [f"{label} {fields[key]}" for key, label in (("cpu family", "family"), ("model", "model")) if fields.get(key)]
    return f"{name} ({', '.join(numbers)})" if numbers else name


def machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        cpu = cpu_name(Path("/proc/cpuinfo").read_text()) or cpu
    except OSError:
        pass
    mem = ""
    try:
        kb = int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text())[1])
        mem = f", {kb / 1024 / 1024:.0f} GiB RAM"
    except (OSError, TypeError):
        pass
    return f"{cpu}, {os.cpu_count()} cores{mem}, {platform.system()} {platform.release()}, Python {platform.python_version()}"


HOW_TO = {
    "detectors": "`entroloop bench detectors` — processors over the synthetic fleet on one core; precision/recall against the fleet's injected labels.",
    "sinks": "`entroloop bench sinks` — one sink process inserting into chDB; Parquet writing; audit verification.",
    "collector": "`entroloop bench collector` — the same engine and workload without the entropy tap, with it, and with top-20 logprobs + host entropy, for a tiny model and one of Qwen2.5-0.5B's shape (random weights); the entropy reduction alone per form.",
    "publisher": "`entroloop bench publisher` — hot-path enqueue latency and throughput of the serving-side publisher, against a bare confluent-kafka Producer in the same runs.",
    "workers": "`entroloop bench workers` — `entroloop worker` (Faust), a plain confluent-kafka loop with the same processors, and the same worker with processors that do nothing (its transport alone), draining the same fleet events, one process each.",
    "lag": "`entroloop bench lag` — emit → queryable lag per event through the pipeline at a fixed request rate.",
}


class BenchmarksFileError(ValueError):
    """The figures file next to the report cannot be read: nothing is merged into it."""


def stored_figures(path: Path = Path("BENCHMARKS.md")) -> dict[str, Any]:
    """Every section's figures kept next to the report ``path`` (its ``.json``); {} before the first.

    Raises ``BenchmarksFileError``, naming the file and the fix, when that file is not a JSON object:
    a benchmark checks this before it measures, so minutes of measuring are not lost at the end."""
    data_path = path.with_suffix(".json")
    if not data_path.exists():
        return {}
    try:
        stored = json.loads(data_path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise BenchmarksFileError(
            f"{data_path} is not valid JSON ({exc}); it holds every section of {path.name}: restore it "
            f"(`git checkout -- {data_path}`), delete it to start the report afresh, or pass another --out") from exc
    if not isinstance(stored, dict):
        raise BenchmarksFileError(f"{data_path} holds a {type(stored).__name__}, not the sections of {path.name}: "
                                  f"restore it (`git checkout -- {data_path}`) or delete it")
    return stored


def write_benchmarks(figures: list[Figure], path: Path = Path("BENCHMARKS.md")) -> Path:
    """Merge ``figures`` into ``path`` (sections present in ``figures`` are replaced)."""
    data_path = path.with_suffix(".json")
    stored = stored_figures(path)
    sections = {f.section for f in figures}
    here, today = machine(), time.strftime("%Y-%m-%d")
    measured = stored.setdefault("_measured", {})
    for section in sections:
        stored[section] = [asdict(f) for f in figures if f.section == section]
        measured[section] = {"machine": here, "date": today}
    stored["_machine"] = [{"machine": here, "date": today}]
    data_path.write_text(json.dumps(stored, indent=1, ensure_ascii=False) + "\n")

    lines = [
        "# Benchmarks",
        "",
        "Written by `entroloop bench ...` (`entroloop bench all` rewrites every section); do not edit by hand.",
        f"Machine: {here} (last written {today}); each section says when and, if elsewhere, where it was measured.",
        "A figure measured several times is the median of its runs, with their spread (lowest–highest) and",
        "the highest 1-minute load average seen while measuring; ratios compare variants measured in the same run.",
        "",
    ]
    for section in sorted(k for k in stored if not k.startswith("_")):
        lines += [f"## {section}", "", HOW_TO.get(section.lower(), ""), ""]
        when = stored["_measured"].get(section)
        if when is None:
            lines += ["Measured: unknown (written before sections carried their date).", ""]
        else:
            where = "" if when["machine"] == here else f" on {when['machine']}"
            lines += [f"Measured {when['date']}{where}.", ""]
        lines += [
            "| figure | measured | unit | runs (spread) | load | target | met | baseline / note |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for f in (Figure(**d) for d in stored[section]):
            met = "" if f.met is None else ("yes" if f.met else "**no**")
            note = "; ".join(x for x in (f.baseline, f.note) if x)
            runs = f"{f.runs} ({f.spread})" if f.spread else str(f.runs)
            load = "" if f.load_average is None else f"{f.load_average:.1f}"
            lines.append(f"| {f.name} | {f.cell()} | {f.unit} | {runs} | {load} | {f.target} | {met} | {note} |")
        lines.append("")
    path.write_text("\n".join(lines))
    return path
