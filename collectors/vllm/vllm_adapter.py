"""The one module that imports vLLM internals (vLLM calls its logits-processor interfaces unstable).

vLLM loads every class registered under the ``vllm.logits_processors`` entry-point group in each
engine core. The group is shared by two interfaces:

* the V1 model runner's ``vllm.v1.sample.logits_processor.LogitsProcessor``:
  ``__init__(vllm_config, device, is_pin_memory)``, ``update_state(BatchUpdate | None)`` with
  added/removed/moved rows, ``apply(logits)``, ``is_argmax_invariant()``;
* Model Runner V2's ``vllm.v1.worker.gpu.sample.logits_processor.LogitsProcessor``:
  ``__init__(vllm_config, req_states)``, ``add_request(slot, params) -> bool``,
  ``apply(logits, ctx)`` where ``ctx.idx_mapping_np`` maps logits rows to request slots.

Model Runner V2 rejects V1-only classes at load time and the V1 runner would call a V2-only class
with the wrong arguments, so one entry point can only serve both if the class *is* both:
``EntropyTapLogitsProcessor`` subclasses each interface that the installed vLLM has and picks its
mode from the constructor's arguments.

Request correlation: ``SamplingParams.extra_args`` (``vllm_xargs`` in the OpenAI API) may carry
``entroloop_request_id`` and ``entroloop_trace_id``; without them a fresh local id is used
(vLLM's logits-processor interfaces do not expose vLLM's own request id). ``entroloop_tap: false``
leaves a request unmeasured (the engine's operator's switch: the gateway drops it from clients).
"""

from __future__ import annotations

import logging
import os
import struct
import time
from typing import Any

import torch
import vllm
from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality
from vllm.v1.sample.logits_processor import LogitsProcessor as V1LogitsProcessor

try:  # Model Runner V2 (vLLM >= 0.2x); absent in older releases.
    from vllm.v1.worker.gpu.sample.logits_processor import (
        LogitsProcessor as V2LogitsProcessor,
    )
except ImportError:  # pragma: no cover - depends on the installed vLLM
    V2LogitsProcessor = None  # type: ignore[assignment,misc]

from entroloop.collectors.vllm.compat import warn_if_unsupported
from entroloop.collectors.vllm.emit import TokenEntropyEmitter, resolve_sink
from entroloop.collectors.vllm.ledger import AddedRow, MovedRow
from entroloop.collectors.vllm.tap import EntropyTap

from entroloop.contract.ids import uuid7
from entroloop.contract.settings import load_settings

log = logging.getLogger(__name__)

# vLLM imports this module in every engine core when it loads its logits processors: the one place
# that runs wherever the tap does, so a vLLM outside the tested range is reported at load time
warn_if_unsupported(getattr(vllm, "__version__", "unknown"), log)

REQUEST_ID_ARG = "entroloop_request_id"
TRACE_ID_ARG = "entroloop_trace_id"
ROUTE_ARG = "entroloop_route"  # the gateway's route, so TokenEntropy and the gateway's Audit name the same one
TAP_ARG = "entroloop_tap"  # false: this request is not measured (`entroloop bench collector`'s plain passes)

_BASES: tuple[type, ...] = (V1LogitsProcessor,) if V2LogitsProcessor is None else (
    V1LogitsProcessor,
    V2LogitsProcessor,
)


def request_ids(params: Any) -> tuple[str, str]:
    """(request id, trace id) from a request's SamplingParams ``extra_args``."""
    extra = getattr(params, "extra_args", None) or {}
    return str(extra.get(REQUEST_ID_ARG) or f"local-{uuid7()}"), str(extra.get(TRACE_ID_ARG) or "")


def measured(params: Any) -> bool:
    """Whether the tap measures this request (``extra_args.entroloop_tap``, default true)."""
    return (getattr(params, "extra_args", None) or {}).get(TAP_ARG, True) is not False


def _served_model_name(vllm_config: Any) -> str:
    name = getattr(vllm_config.model_config, "served_model_name", None) or vllm_config.model_config.model
    return name[0] if isinstance(name, (list, tuple)) else str(name)


class EntropyTapLogitsProcessor(*_BASES):  # type: ignore[misc]
    """vLLM logits processor that measures entropy and returns the logits unchanged."""

    def __init__(self, vllm_config: Any, *args: Any) -> None:
        settings = load_settings()
        self.enabled = settings.entropy_tap_enabled
        if len(args) == 2:  # V1: (device, is_pin_memory)
            device, pin_memory = args
            self.mode = "v1"
        else:  # Model Runner V2: (req_states,)
            (req_states,) = args
            device, pin_memory = req_states.device, device_is_cuda(req_states.device)
            self.mode = "v2"
            self._prompt_len = req_states.prompt_len
        self.tap: EntropyTap | None = None
        if self.enabled:
            emitter = TokenEntropyEmitter(
                resolve_sink(settings.entropy_tap_sink, settings),
                node_id=settings.node_id,
                model=_served_model_name(vllm_config),
            )
            self.emitter = emitter
            self.tap = EntropyTap(
                emitter,
                device=torch.device(device),
                max_rows=vllm_config.scheduler_config.max_num_seqs,
                pin_memory=bool(pin_memory),
                chunk_tokens=settings.entropy_chunk_tokens,
                surprisal=settings.entropy_tap_surprisal,
                compiled=settings.entropy_tap_compiled,
            )
            self.tap.warm_up(vllm_config.model_config.get_vocab_size())
        self._timings = _open_timings(settings.entropy_tap_timings) if self.enabled else None
        log.info("entroloop entropy tap: %s (%s interface)", "on" if self.enabled else "off", self.mode)

    def _timed(self, started: float) -> None:
        """Append the time since ``started`` to the timings file (``entropy_tap_timings``); a failed
        write (a full disk) stops the timing, never the serving step."""
        try:
            os.write(self._timings, _SECONDS.pack(time.perf_counter() - started))  # type: ignore[arg-type]
        except OSError:
            log.exception("entroloop entropy tap: cannot append to ENTROLOOP_ENTROPY_TAP_TIMINGS; timing stopped")
            self._timings = None

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        extra = getattr(sampling_params, "extra_args", None) or {}
        for key in (REQUEST_ID_ARG, TRACE_ID_ARG, ROUTE_ARG):
            if key in extra and not isinstance(extra[key], str):
                raise ValueError(f"vllm_xargs.{key} must be a string")
        if TAP_ARG in extra and not isinstance(extra[TAP_ARG], bool):
            raise ValueError(f"vllm_xargs.{TAP_ARG} must be true or false")

    def _note_route(self, request_id: str, params: Any) -> None:
        route = (getattr(params, "extra_args", None) or {}).get(ROUTE_ARG)
        if route:
            self.emitter.routes[request_id] = route

    # --- V1 interface ------------------------------------------------------------------------
    def is_argmax_invariant(self) -> bool:
        # False on purpose: vLLM applies argmax-invariant processors only to random-sampled rows
        # and after temperature; the tap must see every row's raw logits.
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if self.tap is None or batch_update is None:
            return
        if self._timings is None:
            self._update_state(batch_update)
            return
        started = time.perf_counter()
        self._update_state(batch_update)
        self._timed(started)

    def _update_state(self, batch_update: BatchUpdate) -> None:
        added, removed = [], list(batch_update.removed)
        for index, params, _prompt, output_ids in batch_update.added:
            if not measured(params):
                # Nothing to open, but the row's previous occupant leaves all the same. As a removal
                # it is shipped before the adds, as vLLM's add onto its row would evict it; no other
                # add targets the same row, and later moves find the row empty, as untracked.
                removed.append(index)
                continue
            request_id, trace_id = request_ids(params)
            self._note_route(request_id, params)
            added.append(AddedRow(index, request_id, trace_id, output_ids, temperature=_temperature(params)))
        moved = [
            MovedRow(a, b, swap=direction == MoveDirectionality.SWAP) for a, b, direction in batch_update.moved
        ]
        self.tap.on_batch_update(removed, added, moved)

    # --- Model Runner V2 interface -----------------------------------------------------------
    def add_request(self, req_idx: int, sampling_params: Any) -> bool:
        if self.tap is None:
            return False
        if not measured(sampling_params):
            self.tap.on_batch_update([req_idx], [], [])  # the slot's previous occupant leaves
            return False
        request_id, trace_id = request_ids(sampling_params)
        self._note_route(request_id, sampling_params)
        # The slot's previous occupant (finished or preempted) is evicted and shipped.
        self.tap.on_batch_update([], [AddedRow(req_idx, request_id, trace_id, None, _temperature(sampling_params))], [])
        return True  # we must be called for this request's rows

    # --- both --------------------------------------------------------------------------------
    def apply(self, logits: torch.Tensor, ctx: Any = None) -> torch.Tensor:
        if self.tap is not None:
            started = time.perf_counter() if self._timings is not None else 0.0
            if ctx is None:
                self.tap.on_logits(logits)
            else:
                self._apply_v2(logits, ctx)
            if self._timings is not None:
                self._timed(started)
        return logits

    def _apply_v2(self, logits: torch.Tensor, ctx: Any) -> None:
        # Rows are reordered every step: map each logits row to its request slot on the host.
        slots = ctx.idx_mapping_np
        if logits.shape[0] != len(slots):
            return  # speculative decoding (several rows per request): not supported, vLLM rejects it
        positions = ctx.seq_lens_upper_bound_np - self._prompt_len.np[slots]
        self.tap.on_logits_rows(logits, slots.tolist(), positions.tolist())

    def __del__(self) -> None:  # the engine is shutting down: ship what is left
        tap = getattr(self, "tap", None)
        if tap is not None:
            try:
                tap.flush()
            except Exception:  # noqa: BLE001 - interpreter teardown
                pass


_SECONDS = struct.Struct("<d")


def _open_timings(path: str) -> int | None:
    """The timings file's descriptor, appending (one process's calls in order; several processes may
    share a file: each 8-byte append is atomic), or None when no file is set."""
    if not path:
        return None
    target = path.replace("{pid}", str(os.getpid()))
    try:
        return os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as exc:
        raise ValueError(f"ENTROLOOP_ENTROPY_TAP_TIMINGS={path!r}: cannot append to {target} ({exc.strerror}); "
                         "name a writable file or leave the setting empty") from exc


def _temperature(params: Any) -> float | None:
    """The request's sampling temperature (None for pooling requests, which have none)."""
    value = getattr(params, "temperature", None)
    return float(value) if isinstance(value, (int, float)) else None


def device_is_cuda(device: Any) -> bool:
    return torch.device(device).type == "cuda"
