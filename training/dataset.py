"""The training data of one job: corrected bad cases plus a replay sample of accepted traffic.

* Corrections (``BadCase``: prompt -> correction) are what the adapter must learn. One prompt can be
  corrected several times; the latest correction wins (users refine their corrections).
* Replay examples are audited answers nobody complained about (no feedback at or below the
  negative rating, not a bad case): training on a sample of them limits forgetting, and their
  held-out part is the general set the gate measures loss on. A negative verdict counts only from
  the tenant the answer was served to (``verdict_applies``): another tenant that learned a request id
  cannot pull that answer out of the replay sample.
* PII is already redacted upstream (audit capture redacts before records exist), so nothing here
  sees raw identities.
* De-duplication is by normalized prompt. The train/held-out split and the replay sample are chosen
  by a keyed hash of each example, not by input order or a RNG state, so the same inputs always give
  the same data set, and the data set's SHA-256 digest (over a canonical JSON form) names it.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from entroloop.contract.records import (
    NEGATIVE_RATING,
    Audit,
    BadCase,
    Feedback,
    verdict_applies,
)

CORRECTION = "correction"
REPLAY = "replay"


def normalize_text(text: str) -> str:
    """Case-, width- and whitespace-insensitive form used for de-duplication and answer matching."""
    text = unicodedata.normalize("NFKC", text).casefold()
    text = re.sub(r"[\s]+", " ", text).strip()
    return text.strip(" .!?;:,。！？；：，")


@dataclass(frozen=True)
class Example:
    """One training pair. ``origin`` is the id of the record it came from (bad case or audit)."""

    prompt: str
    completion: str
    source: str
    origin: str

    @property
    def key(self) -> str:
        return f"{self.source}\x00{normalize_text(self.prompt)}"


def _rank(seed: str, salt: str, key: str) -> str:
    return hashlib.sha256(f"{seed}\x00{salt}\x00{key}".encode()).hexdigest()


@dataclass
class TrainingData:
    """Train and held-out examples with the content digest that names the data set."""

    train: list[Example]
    heldout: list[Example]
    stats: dict[str, int] = field(default_factory=dict)

    @property
    def regression_suite(self) -> list[Example]:
        """Held-out corrections: the adapter should now answer them as corrected."""
        return [e for e in self.heldout if e.source == CORRECTION]

    @property
    def general_heldout(self) -> list[Example]:
        """Held-out accepted traffic: the adapter must not get worse at it."""
        return [e for e in self.heldout if e.source == REPLAY]

    def canonical(self) -> bytes:
        body = {
            "train": [asdict(e) for e in self.train],
            "heldout": [asdict(e) for e in self.heldout],
        }
        return json.dumps(body, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode()

    @property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.canonical()).hexdigest()

    def save(self, path: Path) -> None:
        payload = json.loads(self.canonical())
        payload["stats"] = self.stats
        payload["digest"] = self.digest
        Path(path).write_text(json.dumps(payload, ensure_ascii=False, indent=1), encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> TrainingData:
        payload = json.loads(Path(path).read_text(encoding="utf-8"))
        data = cls(
            train=[Example(**e) for e in payload["train"]],
            heldout=[Example(**e) for e in payload["heldout"]],
            stats=payload.get("stats", {}),
        )
        if data.digest != payload["digest"]:
            raise ValueError(f"{path}: data set digest mismatch (file altered?)")
        return data


def _latest_corrections(bad_cases: Iterable[BadCase]) -> list[Example]:
    latest: dict[str, BadCase] = {}
    for case in bad_cases:
        if not case.correction.strip() or not case.prompt.strip():
            continue
        key = normalize_text(case.prompt)
        held = latest.get(key)
        if held is None or (case.emitted_at, case.event_id) > (held.emitted_at, held.event_id):
            latest[key] = case
    return [Example(c.prompt, c.correction, CORRECTION, c.event_id) for c in latest.values()]


def _accepted_traffic(
    audits: Iterable[Audit], feedback: Iterable[Feedback], bad_cases: list[BadCase], negative_rating: int
) -> list[Example]:
    negative_from: dict[str, set[str]] = {}  # request id -> tenants that rated it negative
    for f in feedback:
        if f.rating <= negative_rating:
            negative_from.setdefault(f.request_id, set()).add(f.tenant)
    rejected_requests = {b.request_id for b in bad_cases}
    rejected_audits = {b.audit_id for b in bad_cases if b.audit_id}
    corrected_prompts = {normalize_text(b.prompt) for b in bad_cases}
    first: dict[str, Audit] = {}
    for a in audits:
        key = normalize_text(a.prompt)
        if (
            a.request_id in rejected_requests
            or any(verdict_applies(tenant, a.tenant) for tenant in negative_from.get(a.request_id, ()))
            or a.audit_id in rejected_audits
            or key in corrected_prompts
            or not a.response.strip()
        ):
            continue
        held = first.get(key)
        if held is None or (a.emitted_at, a.event_id) < (held.emitted_at, held.event_id):
            first[key] = a
    return [Example(a.prompt, a.response, REPLAY, a.audit_id or a.event_id) for a in first.values()]


def _split(examples: list[Example], seed: str, heldout_fraction: float) -> tuple[list[Example], list[Example]]:
    ranked = sorted(examples, key=lambda e: _rank(seed, "split", e.key))
    # At least one held-out example once there are two, so the gate always has something to judge.
    n_heldout = math.ceil(len(ranked) * heldout_fraction) if len(ranked) >= 2 else 0
    return ranked[n_heldout:], ranked[:n_heldout]


def build_dataset(
    bad_cases: Iterable[BadCase],
    audits: Iterable[Audit] = (),
    feedback: Iterable[Feedback] = (),
    *,
    replay_ratio: float = 1.0,
    heldout_fraction: float = 0.2,
    negative_rating: int = NEGATIVE_RATING,
    seed: str = "",
) -> TrainingData:
    """Build the job's data set; deterministic for the same inputs (in any order) and ``seed``.

    ``replay_ratio`` is replay examples per correction (the rest of accepted traffic is unused).
    """
    bad_cases = list(bad_cases)
    corrections = _latest_corrections(bad_cases)
    accepted = _accepted_traffic(audits, feedback, bad_cases, negative_rating)
    n_replay = min(len(accepted), math.floor(replay_ratio * len(corrections)))
    replay = sorted(accepted, key=lambda e: _rank(seed, "replay", e.key))[:n_replay]
    c_train, c_heldout = _split(corrections, seed, heldout_fraction)
    r_train, r_heldout = _split(replay, seed, heldout_fraction)
    order = lambda e: _rank(seed, "order", e.key)  # noqa: E731 - a stable, input-independent order
    data = TrainingData(
        train=sorted(c_train + r_train, key=order),
        heldout=sorted(c_heldout + r_heldout, key=order),
    )
    data.stats = {
        "bad_cases_in": len(bad_cases),
        "corrections": len(corrections),
        "accepted_available": len(accepted),
        "replay": len(replay),
        "train": len(data.train),
        "heldout": len(data.heldout),
        "regression_suite": len(data.regression_suite),
        "general_heldout": len(data.general_heldout),
    }
    return data


__all__ = ["CORRECTION", "REPLAY", "Example", "TrainingData", "build_dataset", "normalize_text"]
