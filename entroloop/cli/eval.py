"""`entroloop eval ...`: measure the detectors on the user's own labelled JSONL.

The figures a project computes on data it generated itself say little about real traffic; these
commands let users measure (and calibrate) the same code the pipeline runs on their labels.

Every subcommand shares one shape (helpers below, so a new one stays a single function):
- reads JSONL, one object per line; unknown keys are ignored; blank lines are skipped; a line that
  is not JSON or misses a required field stops the command with exit code 2 and an error naming
  ``FILE:LINE`` and the field;
- prints a table; with ``--json`` the LAST line of stdout is one JSON object with the figures;
- with ``--predictions OUT.jsonl`` writes one line per input line, same order, carrying the input's
  ``id`` when it has one.

Subcommands: ``pii`` (this file). ``entropy``, ``corrections`` and ``intent`` follow the same shape.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Annotated, Any, TypeVar

import msgspec
import typer
from rich.console import Console
from rich.table import Table

eval_app = typer.Typer(
    help="Measure the detectors on your own labelled JSONL (formats: `entroloop eval COMMAND --help`).",
    no_args_is_help=True,
)
out_console = Console()
err_console = Console(stderr=True)

T = TypeVar("T")

InputFile = Annotated[
    Path, typer.Argument(exists=True, dir_okay=False, readable=True, help="Labelled JSONL, one object per line.")
]
AsJson = Annotated[bool, typer.Option("--json", help="End stdout with the figures as one JSON line.")]
Predictions = Annotated[
    Path | None,
    typer.Option("--predictions", help="Write one JSON line per input line (same order, with its id) here."),
]


# --- shared helpers ----------------------------------------------------------------------------


class EvalInputError(Exception):
    """A line of the input that cannot be evaluated, as ``FILE:LINE: what is wrong``."""


def read_jsonl(path: Path, schema: type[T]) -> list[T]:
    """Every non-blank line of ``path`` converted to ``schema`` (a msgspec Struct; unknown keys ignored).

    Raises ``EvalInputError`` naming the file, the 1-based line number and the field."""
    records: list[T] = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
            except json.JSONDecodeError as exc:
                raise EvalInputError(f"{path}:{number}: not valid JSON ({exc.msg}, column {exc.colno})") from None
            if not isinstance(raw, dict):
                raise EvalInputError(f"{path}:{number}: expected a JSON object, got {type(raw).__name__}")
            try:
                records.append(msgspec.convert(raw, schema))
            except msgspec.ValidationError as exc:
                raise EvalInputError(f"{path}:{number}: {exc}") from None
            check = getattr(records[-1], "check", None)
            if check is not None:
                problem = check()
                if problem:
                    raise EvalInputError(f"{path}:{number}: {problem}")
    return records


def fail(message: str) -> typer.Exit:
    """Print ``message`` to stderr; the caller raises the returned exit (code 2: bad input)."""
    err_console.print(f"[red]{message}[/red]", soft_wrap=True)
    return typer.Exit(2)


def print_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[object]]) -> None:
    """One rich table on stdout (before the ``--json`` line, which stays last)."""
    table = Table(*columns, title=title)
    for row in rows:
        table.add_row(*(str(cell) for cell in row))
    out_console.print(table)


def emit_json(figures: dict[str, Any]) -> None:
    """The figures as one JSON object on the last line of stdout."""
    out_console.file.flush()
    print(json.dumps(figures, ensure_ascii=False, sort_keys=True), flush=True)


def write_predictions(path: Path | None, rows: Iterable[dict[str, Any]]) -> None:
    """One JSON object per input line, same order."""
    if path is None:
        return
    with path.open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")


def ratio(numerator: int, denominator: int) -> float:
    return round(numerator / denominator, 4) if denominator else 0.0


# --- eval pii ----------------------------------------------------------------------------------


class PiiSpan(msgspec.Struct):
    """A labelled substring: ``pii`` true for PII that must disappear, false for a look-alike."""

    kind: str
    value: str
    pii: bool


class PiiLine(msgspec.Struct):
    text: str
    id: str | int | None = None
    spans: list[PiiSpan] = []

    def check(self) -> str:
        for i, span in enumerate(self.spans):
            if not span.value:
                return f"spans[{i}].value is empty"
            if span.value not in self.text:
                return f"spans[{i}].value ({span.kind}) does not occur in text"
        return ""


@eval_app.command("pii")
def pii(file: InputFile, as_json: AsJson = False, predictions: Predictions = None) -> None:
    """PII redaction on labelled text: recall per kind and false positives per look-alike kind.

    Lines: {"id", "text", "spans": [{"kind", "value", "pii": bool}]}; spans are optional, unknown keys ignored.

    Judged on the text as redacted by the redactor the gateway and the bad-case joiner apply before storage: a span with "pii": true is recalled when its value no longer appears; a look-alike ("pii": false: order numbers, amounts, dates, hotlines, versions...) is a false positive when its value was altered.
    """
    from entroloop.cli.common import settings_or_exit
    from entroloop.infra.pii import PiiRedactor

    try:
        lines = read_jsonl(file, PiiLine)
    except EvalInputError as exc:
        raise fail(str(exc)) from None
    redactor = PiiRedactor.from_settings(settings_or_exit())
    found: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # kind -> [recalled, support]
    altered: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # kind -> [altered, support]
    rows = []
    for line in lines:
        redacted = redactor.redact(line.text).text
        for span in line.spans:
            gone = span.value not in redacted
            tally = found[span.kind] if span.pii else altered[span.kind]
            tally[0] += int(gone)
            tally[1] += 1
        rows.append({"id": line.id, "text": redacted})
    write_predictions(predictions, rows)

    figures = {
        "recall": {k: {"recall": ratio(n, s), "support": s} for k, (n, s) in sorted(found.items())},
        "false_positives": {k: {"rate": ratio(n, s), "support": s} for k, (n, s) in sorted(altered.items())},
        "lines": len(lines),
    }
    table_rows: list[Sequence[object]] = [
        (kind, "pii", v["support"], f"recall {v['recall']:.3f}") for kind, v in figures["recall"].items()
    ]
    table_rows += [
        (kind, "look-alike", v["support"], f"false positives {v['rate']:.3f}")
        for kind, v in figures["false_positives"].items()
    ]
    recalled = sum(n for n, _ in found.values())
    support = sum(s for _, s in found.values())
    fp = sum(n for n, _ in altered.values())
    fp_support = sum(s for _, s in altered.values())
    if support or fp_support:
        table_rows.append(("all", "pii", support, f"recall {ratio(recalled, support):.3f}"))
        table_rows.append(("all", "look-alike", fp_support, f"false positives {ratio(fp, fp_support):.3f}"))
    print_table(f"PII redaction on {file.name} ({len(lines)} lines)", ("kind", "labelled as", "spans", "figure"),
                table_rows)
    if as_json:
        emit_json(figures)


# --- eval corrections --------------------------------------------------------------------------


class CorrectionLine(msgspec.Struct):
    """A model output and the user's correction, optionally with the labels it deserves."""

    prompt: str
    output: str
    corrected: str
    id: str | int | None = None
    labels: list[str] | None = None

    def check(self) -> str:
        from entroloop.streams.rules import LABELS, OTHER

        unknown = sorted(set(self.labels or ()) - {*LABELS, OTHER})
        if unknown:
            return f"labels {unknown} are not in the vocabulary ({', '.join((*LABELS, OTHER))})"
        return ""


def score_corrections(lines: Sequence[CorrectionLine], joiner: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Each line through ``joiner`` (a ``BadCaseJoiner``) as live feedback goes: the figures of
    `eval corrections --json` and one prediction row per line (`entroloop bench detectors` reports
    the same figures)."""
    import time

    from entroloop.contract.ids import uuid7
    from entroloop.contract.records import Audit, Feedback
    from entroloop.streams.bad_cases import REGRESSION_LABEL, minimal_failing_span

    now = time.time()
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])  # label -> [true pos, predicted, support]
    exact = labelled = 0
    rows = []
    for number, line in enumerate(lines):
        request = f"eval-{number}"
        common = {"emitted_at": now, "node_id": "eval", "seq": number, "request_id": request}
        audit = Audit(event_id=uuid7(now), **common, audit_id=request, model="eval", prompt=line.prompt,
                      response=line.output)
        feedback = Feedback(event_id=uuid7(now), **common, rating=0, corrected_answer=line.corrected)
        case = joiner.build(audit, feedback)
        predicted = [label for label in case.labels if label != REGRESSION_LABEL]
        (start, end), replacement = minimal_failing_span(case.response, case.correction)
        rows.append({"id": line.id, "labels": predicted, "minimal_failing_example": {
            "start": start, "end": end, "output": case.response[start:end], "corrected": replacement}})
        if line.labels is None:
            continue
        labelled += 1
        exact += int(set(predicted) == set(line.labels))
        for label in set(predicted) | set(line.labels):
            tally = counts[label]
            tally[0] += int(label in predicted and label in line.labels)
            tally[1] += int(label in predicted)
            tally[2] += int(label in line.labels)
    figures = {
        "exact_set": ratio(exact, labelled),
        "per_label": {label: {"precision": ratio(tp, n_pred), "recall": ratio(tp, support), "support": support}
                      for label, (tp, n_pred, support) in sorted(counts.items())},
        "lines": len(lines),
        "labelled": labelled,
    }
    return figures, rows


@eval_app.command("corrections")
def corrections(file: InputFile, as_json: AsJson = False, predictions: Predictions = None) -> None:
    """Bad-case labels of corrections: exact label set and precision/recall per label.

    Lines: {"id", "prompt", "output", "corrected", "labels": [...]}; id and labels are optional, unknown keys ignored.

    Each line runs through the bad-case joiner live feedback goes through (redaction, diff, labels from the same settings, so ENTROLOOP_COMPLIANCE_LEXICON / _PATTERNS count); labels: number, fact, amount_format, unit, date, json_schema, compliance, other. Predictions: {"id", "labels", "minimal_failing_example": {"start", "end", "output", "corrected"}}.
    """
    from entroloop.cli.common import settings_or_exit
    from entroloop.streams.bad_cases import BadCaseJoiner

    try:
        lines = read_jsonl(file, CorrectionLine)
    except EvalInputError as exc:
        raise fail(str(exc)) from None
    figures, rows = score_corrections(lines, BadCaseJoiner.from_settings(settings_or_exit()))
    write_predictions(predictions, rows)
    labelled = figures["labelled"]
    table_rows: list[Sequence[object]] = [
        (label, v["support"], f"{v['precision']:.3f}", f"{v['recall']:.3f}") for label, v in figures["per_label"].items()
    ]
    if labelled:
        table_rows.append(("exact label set", labelled, "", f"{figures['exact_set']:.3f}"))
    print_table(f"Bad-case labels on {file.name} ({len(lines)} lines, {labelled} labelled)",
                ("label", "support", "precision", "recall"), table_rows)
    if as_json:
        emit_json(figures)


# --- eval entropy ------------------------------------------------------------------------------


class EntropyLabel(msgspec.Struct):
    loop: bool = False
    gibberish: bool = False


class EntropyLine(msgspec.Struct):
    """One request: its per-token entropies (nats), optionally the sampled token ids and labels."""

    model: str
    entropy: list[float]
    id: str | int | None = None
    route: str = "default"
    token_ids: list[int] | None = None
    surprisal: list[float] | None = None
    """Each sampled token's surprisal, -log p(token) in nats before temperature (optional)."""
    sampling_entropy: list[float] | None = None
    """Each token's entropy at the request's sampling temperature, nats (optional; sampled requests)."""
    label: EntropyLabel | None = None

    def check(self) -> str:
        for name, values in (("surprisal", self.surprisal), ("sampling_entropy", self.sampling_entropy)):
            if values is None:
                continue
            if len(values) != len(self.entropy):
                return f"{name} has {len(values)} values for {len(self.entropy)} entropies"
            for i, value in enumerate(values):
                if not value >= 0 or value == float("inf"):
                    return f"{name}[{i}] = {value} is not a finite value >= 0 nats"
        if not self.entropy:
            return "entropy is empty (one value per generated token expected)"
        for i, value in enumerate(self.entropy):
            if not value >= 0 or value == float("inf"):
                return f"entropy[{i}] = {value} is not a finite entropy >= 0 nats"
        if self.token_ids is not None and len(self.token_ids) != len(self.entropy):
            return f"token_ids has {len(self.token_ids)} values for {len(self.entropy)} entropies"
        if self.token_ids is not None and any(t < 0 for t in self.token_ids):
            return "token_ids must be >= 0"
        return ""

    def record(self, request_id: str, number: int, at: float, node: str, with_ids: bool = True,
               with_surprisals: bool | None = None, with_sampling: bool = True):  # -> TokenEntropy
        """The line as the TokenEntropy record a serving node would send (``with_ids=False``: the
        entropies alone, as from a sender without token ids or logprobs; ``with_surprisals=False``:
        token ids but no surprisals; ``with_sampling=False``: without the entropies at the sampling
        temperature, as from a sender that only has the model's own)."""
        from entroloop.contract.ids import derived_event_id
        from entroloop.contract.records import (
            TokenEntropy,
            pack_entropies,
            pack_token_hashes,
        )

        return TokenEntropy(
            event_id=derived_event_id(request_id, node, number, at=at), emitted_at=at, node_id=node,
            seq=number, request_id=request_id, trace_id="0" * 31 + "1", model=self.model, route=self.route,
            entropies=pack_entropies(self.entropy),
            token_hashes=pack_token_hashes(self.token_ids) if with_ids and self.token_ids is not None else b"",
            surprisals=pack_entropies(self.surprisal)
            if (with_ids if with_surprisals is None else with_surprisals) and self.surprisal is not None else b"",
            sampling_entropies=pack_entropies(self.sampling_entropy)
            if with_sampling and self.sampling_entropy is not None else b"",
        )


@eval_app.command("entropy")
def entropy(file: InputFile, as_json: AsJson = False, predictions: Predictions = None) -> None:
    """Loop and gibberish detection on labelled entropy traces: precision, recall, F1 per label.

    Lines: {"id", "model", "entropy": [nats per generated token], "token_ids": [ints, optional], "surprisal": [nats of each sampled token, optional], "sampling_entropy": [nats at the request's sampling temperature, optional], "label": {"loop": bool, "gibberish": bool} (optional)}; "route" optional, unknown keys ignored.

    Each line is one request, fed in file order through the same detectors and settings the pipeline runs (EntropyAnomalyDetector and EntropyBaselineDetector from settings), so per-model baselines learn as they go, as they would live. Only labelled lines count in the figures; predictions: {"id", "loop", "gibberish", "alerts": [...]}.
    """
    from entroloop.cli.common import settings_or_exit
    from entroloop.contract.records import Alert
    from entroloop.streams.entropy_anomaly import (
        GIBBERISH,
        LOOP,
        EntropyAnomalyDetector,
    )
    from entroloop.streams.entropy_baseline import EntropyBaselineDetector

    try:
        lines = read_jsonl(file, EntropyLine)
    except EvalInputError as exc:
        raise fail(str(exc)) from None
    settings = settings_or_exit()
    detectors = (EntropyAnomalyDetector.from_settings(settings), EntropyBaselineDetector.from_settings(settings))
    counts = {name: {"tp": 0, "fp": 0, "fn": 0, "support": 0, "predicted": 0} for name in ("loop", "gibberish")}
    rows = []
    start = 1_700_000_000.0
    for number, line in enumerate(lines):
        at = start + number * 0.001  # one request per millisecond of event time, in file order
        request_id = f"eval-{number}-{line.id}"
        record = line.record(request_id, number, at, "eval")
        alerts = [a for d in detectors for a in d.process(record) if isinstance(a, Alert)]
        flagged = {"loop": any(a.rule == LOOP for a in alerts), "gibberish": any(a.rule == GIBBERISH for a in alerts)}
        for name, tally in counts.items():
            tally["predicted"] += int(flagged[name])
            if line.label is None:
                continue
            truth = bool(getattr(line.label, name))
            tally["support"] += int(truth)
            tally["tp"] += int(truth and flagged[name])
            tally["fp"] += int(flagged[name] and not truth)
            tally["fn"] += int(truth and not flagged[name])
        rows.append({"id": line.id, **flagged, "alerts": [
            {"rule": a.rule, "token_start": a.token_start, "token_end": a.token_end, "value": round(a.value, 4),
             "baseline": a.baseline, "detail": a.detail} for a in alerts]})
    write_predictions(predictions, rows)

    labelled = sum(1 for line in lines if line.label is not None)
    figures: dict[str, Any] = {"requests": len(lines), "labelled": labelled}
    for name, t in counts.items():
        precision = ratio(t["tp"], t["tp"] + t["fp"]) if labelled else None
        recall = ratio(t["tp"], t["support"]) if labelled else None
        f1 = (round(2 * precision * recall / (precision + recall), 4) if precision and recall else 0.0) \
            if labelled else None
        figures[name] = {"precision": precision, "recall": recall, "f1": f1, "support": t["support"],
                         "predicted": t["predicted"]}
    print_table(
        f"Entropy anomalies on {file.name} ({len(lines)} requests, {labelled} labelled)",
        ("label", "support", "flagged", "precision", "recall", "f1"),
        [(name, v["support"], v["predicted"], *("-" if v[k] is None else f"{v[k]:.3f}" for k in ("precision", "recall", "f1")))
         for name, v in ((n, figures[n]) for n in ("loop", "gibberish"))],
    )
    if as_json:
        emit_json(figures)


def register(app: typer.Typer) -> None:
    app.add_typer(eval_app, name="eval")


__all__ = ["EvalInputError", "emit_json", "eval_app", "fail", "print_table", "read_jsonl", "register",
           "write_predictions"]
