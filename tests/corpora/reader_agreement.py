"""How far two independent readings of the same trace file agree, and the files to score on each.

A reader's label is the reference the detectors are scored against, so where two readers split on a
text, no detector can be right by both. This module measures that ceiling: per label (loop,
gibberish) the share of texts both readings agree on and Cohen's kappa (agreement beyond what the
two readers' base rates give by chance). It also writes two trace files for ``entroloop eval
entropy``: the same lines labelled by the second reading, and only the lines both readings agree on
(the unambiguous subset), so the detectors are scored by the public command, not here.

``python -m tests.corpora.reader_agreement TRACES SECOND_LABELS OUT_FOLDER``: TRACES carries the
first reading in ``label``; SECOND_LABELS is a reading sheet's labels (``{"key", "loop",
"gibberish", "why"}`` per line, by sheet key).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.corpora.lm_traces import read_labels, sheet_key, write_lines

LABELS = ("loop", "gibberish")


@dataclass(frozen=True)
class Agreement:
    """Two readings of one label over the same texts."""

    both: int
    first_only: int
    second_only: int
    neither: int

    @property
    def total(self) -> int:
        return self.both + self.first_only + self.second_only + self.neither

    @property
    def observed(self) -> float:
        return (self.both + self.neither) / self.total

    @property
    def kappa(self) -> float:
        """Cohen's kappa; 1.0 when both readings are constant and equal (nothing to disagree on)."""
        first, second = (self.both + self.first_only) / self.total, (self.both + self.second_only) / self.total
        chance = first * second + (1 - first) * (1 - second)
        return 1.0 if chance == 1 else (self.observed - chance) / (1 - chance)

    def as_dict(self) -> dict[str, float | int]:
        return {"both": self.both, "first_only": self.first_only, "second_only": self.second_only,
                "neither": self.neither, "agreement": round(self.observed, 4), "kappa": round(self.kappa, 4)}


def agreement(lines: list[dict], second: dict[str, dict[str, bool]]) -> dict[str, Agreement]:
    """Per label, how the lines' own labels (the first reading) and ``second`` agree."""
    keys = {sheet_key(line["id"]) for line in lines}
    if keys != set(second):
        raise ValueError(f"second reading: {len(set(second) - keys)} unknown keys, none for {len(keys - set(second))} lines")
    counts = {}
    for name in LABELS:
        pairs = [(line["label"][name], second[sheet_key(line["id"])][name]) for line in lines]
        counts[name] = Agreement(both=pairs.count((True, True)), first_only=pairs.count((True, False)),
                                 second_only=pairs.count((False, True)), neither=pairs.count((False, False)))
    return counts


def split_files(lines: list[dict], second: dict[str, dict[str, bool]], out: Path, stem: str) -> tuple[Path, Path]:
    """``<stem>-second.jsonl`` (every line, labelled by the second reading) and ``<stem>-agreed.jsonl``
    (the lines whose two readings agree on both labels)."""
    relabelled = [{**line, "label": second[sheet_key(line["id"])]} for line in lines]
    agreed = [line for line in lines if line["label"] == second[sheet_key(line["id"])]]
    out.mkdir(parents=True, exist_ok=True)
    paths = out / f"{stem}-second.jsonl", out / f"{stem}-agreed.jsonl"
    write_lines(relabelled, paths[0])
    write_lines(agreed, paths[1])
    return paths


def _command_line(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.corpora.reader_agreement", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("traces", type=Path, help="trace file whose 'label' is the first reading")
    parser.add_argument("second", type=Path, help="the second reading's labels (JSONL by sheet key)")
    parser.add_argument("out", type=Path, help="folder for the relabelled and agreed trace files")
    args = parser.parse_args(argv)
    lines = [json.loads(raw) for raw in args.traces.read_text().splitlines()]
    second = read_labels(args.second)
    counts = agreement(lines, second)
    second_path, agreed_path = split_files(lines, second, args.out, args.traces.stem)
    print(json.dumps({name: count.as_dict() for name, count in counts.items()}, indent=1))
    print(f"[reader-agreement] wrote {second_path} and {agreed_path}; score each with "
          f"`entroloop eval entropy FILE --json`", file=sys.stderr)


if __name__ == "__main__":
    _command_line(sys.argv[1:])
