"""The steps of a retraining job, wired: data set -> LoRA training -> gate -> registry (-> publish).

Each step writes its own output into the job's work folder and returns a small JSON-able result
that ``JobRunner`` records in status.json and as an Action record. Steps are safe to re-run after a
crash: the data set is rebuilt deterministically (and must give the same digest), training resumes
from its latest checkpoint, the gate is a pure measurement, registration is idempotent.

Where the records come from is a ``RecordSource``: the embedded bus log, JSON Lines files, a list
(tests), or, in distributed mode, ClickHouse plus the WORM audit log (``entroloop.training.sources``), which
selects per request (``records_for``) instead of handing over everything. Only records of the
request's model, up to the end of its window, are used.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import msgspec
from entroloop.training.dataset import TrainingData, build_dataset
from entroloop.training.jobs import Job, Step

from entroloop.contract.records import (
    AnyRecord,
    Audit,
    BadCase,
    Event,
    Feedback,
    RetrainRequest,
)


class RecordSource(Protocol):
    def records(self) -> Iterable[Event]: ...


class RequestRecordSource(Protocol):
    """A source that selects (and samples) for one request, e.g. ``entroloop.training.sources.WarehouseSource``."""

    def records_for(self, request: RetrainRequest) -> Iterable[Event]: ...


def source_records(source: RecordSource | RequestRecordSource, request: RetrainRequest) -> Iterable[Event]:
    """The records ``source`` offers for ``request`` (still filtered by ``select_training_records``)."""
    select = getattr(source, "records_for", None)
    return select(request) if select is not None else source.records()  # type: ignore[union-attr]


@dataclass
class MemorySource:
    items: list[Event] = field(default_factory=list)

    def records(self) -> Iterable[Event]:
        return list(self.items)


@dataclass
class JsonLinesSource:
    """Records as JSON Lines (``msgspec.json.encode(record)`` per line, any kind, tagged)."""

    paths: list[Path]

    def records(self) -> Iterator[Event]:
        decoder = msgspec.json.Decoder(AnyRecord)
        for path in self.paths:
            with open(path, "rb") as fh:
                for line in fh:
                    if line.strip():
                        yield decoder.decode(line)


@dataclass
class BusSource:
    """Every bad case, audit and feedback record in the embedded bus log (``DATA_DIR/log``)."""

    log_dir: Path
    partitions: int
    topic_prefix: str = ""

    def records(self) -> Iterator[Event]:
        from entroloop.contract.codec import CodecError, decode
        from entroloop.infra.bus import LocalLog

        log = LocalLog(self.log_dir, self.partitions)
        try:
            for record_type in (BadCase, Audit, Feedback):
                topic = self.topic_prefix + record_type.topic
                for partition in range(self.partitions):
                    for _key, value in log.read(topic, partition, 0, log.end_offset(topic, partition)):
                        try:
                            yield decode(value)
                        except CodecError:
                            continue  # the sink already dead-lettered it; not training material
        finally:
            log.close()


def select_training_records(records: Iterable[Event], request: RetrainRequest
                            ) -> tuple[list[BadCase], list[Audit], list[Feedback]]:
    bad, audits, feedback = [], [], []
    until = request.window_end or float("inf")
    for r in records:
        if r.emitted_at > until:
            continue
        if isinstance(r, BadCase) and r.model == request.model:
            bad.append(r)
        elif isinstance(r, Audit) and r.model == request.model:
            audits.append(r)
        elif isinstance(r, Feedback):
            feedback.append(r)
    return bad, audits, feedback


class TrainingPipeline:
    """Builds the ``Step`` list for ``JobRunner`` from settings and collaborators.

    ``registry`` may be None (train and gate only: ``entroloop train --dry-run``); ``publish`` is an
    optional callable(adapter_id) run after registration (the canary rollout).
    """

    def __init__(self, settings: Any, source: RecordSource | RequestRecordSource, registry: Any = None,
                 train_overrides: dict[str, Any] | None = None, gate_overrides: dict[str, Any] | None = None,
                 progress: bool = True, publish: Callable[[str], dict[str, Any]] | None = None) -> None:
        if not settings.base_model_path:
            raise ValueError("ENTROLOOP_BASE_MODEL_PATH is not set: the trainer needs the base model folder")
        self.settings = settings
        self.base_model = Path(settings.base_model_path)
        self.source = source
        self.registry = registry
        self.train_overrides = train_overrides or {}
        self.gate_overrides = gate_overrides or {}
        self.progress = progress
        self.publish = publish
        self._base_digest: str | None = None

    @property
    def base_model_digest(self) -> str:
        if self._base_digest is None:
            from entroloop.training.modeling import folder_digest

            self._base_digest = folder_digest(self.base_model)
        return self._base_digest

    def steps(self) -> list[Step]:
        steps = [Step("dataset", self.dataset), Step("train", self.train), Step("gate", self.gate)]
        if self.registry is not None:
            steps.append(Step("register", self.register))
        if self.publish is not None:
            steps.append(Step("publish", lambda job: self.publish(job.status()["results"]["register"]["adapter_id"])))
        return steps

    # --- steps -------------------------------------------------------------------------------
    def dataset(self, job: Job) -> dict[str, Any]:
        request = job.request
        bad, audits, feedback = select_training_records(source_records(self.source, request), request)
        data = build_dataset(
            bad, audits, feedback, replay_ratio=self.settings.train_replay_ratio,
            heldout_fraction=self.settings.train_heldout_fraction,
            negative_rating=self.settings.badcase_negative_rating, seed=request.trigger_key,
        )
        data.save(job.work / "dataset.json")
        result: dict[str, Any] = {"dataset_digest": data.digest, **data.stats}
        if not data.train or not data.regression_suite:
            result["final_state"] = "rejected"
            result["reason"] = "not enough corrected bad cases to train and to hold some out"
        return result

    def _parent(self, job: Job) -> tuple[str, Path | None]:
        if self.registry is None:
            return "", None
        parent = self.registry.promoted(job.request.model)
        if not parent:
            return "", None
        folder = job.work / "parent"
        if not (folder / "adapter_config.json").exists():
            self.registry.fetch(parent, folder)
        return parent, folder

    def train(self, job: Job) -> dict[str, Any]:
        from entroloop.training.trainer import LoraTrainer, TrainConfig

        data = TrainingData.load(job.work / "dataset.json")
        _parent_id, parent_dir = self._parent(job)
        config = TrainConfig.from_settings(self.settings, **self.train_overrides)
        result = LoraTrainer(self.base_model, config, progress=self.progress, init_adapter=parent_dir).train(
            data.train, job.work
        )
        out = result.to_dict()
        losses = out.pop("losses")
        out["first_loss"], out["last_loss"] = losses[0], losses[-1]
        return out

    def gate(self, job: Job) -> dict[str, Any]:
        from entroloop.training.gate import GateConfig, RegressionGate

        data = TrainingData.load(job.work / "dataset.json")
        _parent_id, parent_dir = self._parent(job)
        config = GateConfig.from_settings(self.settings, **self.gate_overrides)
        report = RegressionGate(self.base_model, config).evaluate(job.work / "adapter", data, parent_dir)
        out = report.to_dict()
        if not report.accepted:
            out["final_state"] = "rejected"
        return out

    def register(self, job: Job) -> dict[str, Any]:
        status = job.status()
        parent_id, _ = self._parent(job)
        results = status["results"]
        metrics = {
            "gate": {k: v for k, v in results["gate"].items() if k not in ("failures", "seconds")},
            "train": {k: results["train"].get(k) for k in ("steps", "first_loss", "last_loss", "precision", "train_tokens")},
            "dataset": {k: v for k, v in results["dataset"].items() if k != "seconds"},
        }
        manifest = self.registry.register(
            job.work / "adapter", model=job.request.model, base_model_digest=self.base_model_digest,
            dataset_digest=results["dataset"]["dataset_digest"], metrics=metrics, parent=parent_id,
            trigger_key=job.trigger_key,
        )
        return {"adapter_id": manifest.adapter_id, "parent_adapter": parent_id, "files": len(manifest.files)}


__all__ = [
    "BusSource", "JsonLinesSource", "MemorySource", "RecordSource", "RequestRecordSource", "TrainingPipeline",
    "select_training_records", "source_records",
]
