"""``entroloop bench collector``: tokens/s of one vLLM engine without the entropy tap, with it, and
with the common practice (top-20 logprobs + entropy on the host), measured in one run.

Needs the ML environment (.venv-ml: torch + the vLLM CPU build, ``scripts/install_ml_env.sh``);
the command itself imports neither until it runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

console = Console(stderr=True)

TAP_TARGET_RATIO = 0.99  # on a GPU (DESIGN.md, "Targets")


def collector(
    requests: Annotated[int, typer.Option(help="Requests in the timed batch.")] = 16,
    max_tokens: Annotated[int, typer.Option(help="Tokens generated per request.")] = 64,
    vocab: Annotated[int, typer.Option(help="Vocabulary of the random model (the tap's cost scales with it).")] = 32000,
    hidden: Annotated[int, typer.Option(help="Hidden size of the random model (multiple of 64).")] = 256,
    model: Annotated[Path | None, typer.Option(help="Use this local model folder instead of building one.")] = None,
    out: Annotated[Path, typer.Option("--out", help="BENCHMARKS.md to update.")] = Path("BENCHMARKS.md"),
    as_json: Annotated[bool, typer.Option("--json", help="End with the figures as one JSON line.")] = False,
) -> None:
    """Generation tokens/s: plain engine vs entropy tap vs top-20 logprobs (ratios from one run)."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        console.print("[red]entroloop bench collector needs the ML environment: bash scripts/install_ml_env.sh, "
                      "then .venv-ml/bin/entroloop bench collector[/red]")
        raise typer.Exit(2)
    from collectors.vllm import bench

    work = bench.Workload(requests=requests, max_tokens=max_tokens, vocab=vocab, hidden=hidden)
    with console.status("running plain / tap / top-20 engines (one process each)"):
        figures = bench.run(work, model=model)
    table = Table("variant", "tokens/s", "× plain", "shipped per token")
    table.add_row("plain engine", f"{figures['plain_tokens_per_s']:,.1f}", "1.000", "—")
    table.add_row("entropy tap", f"{figures['tap_tokens_per_s']:,.1f}", f"{figures['tap_ratio']:.3f}", "2 B (float16)")
    table.add_row("top-20 logprobs + host entropy", f"{figures['top20_tokens_per_s']:,.1f}",
                  f"{figures['top20_ratio']:.3f}",
                  f"{figures['top20_logprob_bytes_per_request'] / max_tokens:,.0f} B")
    Console().print(table)
    if figures["top20_entropy_abs_error_mean"] is not None:
        console.print(f"top-20 entropy error vs exact: mean {figures['top20_entropy_abs_error_mean']:.3f}, "
                      f"max {figures['top20_entropy_abs_error_max']:.3f} nats "
                      f"(exact entropy mean {figures['exact_entropy_mean']:.2f} nats)")
    _write_report(figures, out)
    if as_json:
        print(json.dumps(figures))


def _write_report(figures: dict, out: Path) -> None:
    from entroloop.benchmarks.report import Figure, write_benchmarks

    section = "collector"
    note = (f"CPU figures (vLLM CPU build, random Llama, vocab {figures['workload']['vocab']:,}, "
            f"hidden {figures['workload']['hidden']}); the target is a GPU target")
    rows = [
        Figure(section, "plain engine, generation tokens/s", figures["plain_tokens_per_s"], "tokens/s", note=note),
        Figure(section, "entropy tap / plain", figures["tap_ratio"], "×", target=f">= {TAP_TARGET_RATIO} (GPU)",
               met=figures["tap_ratio"] >= TAP_TARGET_RATIO, baseline="top-20 logprobs: 0.73×–0.95×"),
        Figure(section, "top-20 logprobs + host entropy / plain", figures["top20_ratio"], "×",
               baseline="common practice, measured in the same run"),
        Figure(section, "top-20 entropy mean abs error vs exact", figures["top20_entropy_abs_error_mean"], "nats",
               note=f"max {figures['top20_entropy_abs_error_max']:.3g} nats, exact mean "
               f"{figures['exact_entropy_mean']:.2f} nats; the tap is exact (full vocabulary)"
               if figures["top20_entropy_abs_error_max"] is not None else ""),
        Figure(section, "top-20 logprobs payload per request", figures["top20_logprob_bytes_per_request"], "bytes",
               baseline=f"tap: 2 bytes/token = {2 * figures['workload']['max_tokens']} bytes/request"),
    ]
    write_benchmarks(rows, out)


def register(app: typer.Typer) -> None:
    from entroloop.cli.bench import add_benchmark

    add_benchmark("collector", collector)
