"""From shipped entropy chunks to TokenEntropy records, and where those records go.

The sink is any ``publish(record)`` callable. Which one a serving node uses is configuration
(``ENTROLOOP_ENTROPY_TAP_SINK``), because the tap is constructed by vLLM, not by our code:

* ``publisher`` (default): the node's non-blocking Kafka publisher (``entroloop.collectors.publisher``), built
  from the ``ENTROLOOP_`` settings; with no ``ENTROLOOP_KAFKA_BOOTSTRAP``, a frame file in DATA_DIR.
* ``file:PATH``: append length-prefixed codec frames to PATH (one writer per process; the path may
  contain ``{pid}``). Useful for tests and for nodes without a broker.
* ``module:attribute``: a callable taking a record, or a zero-argument factory returning one.

No torch, no vLLM here.
"""

from __future__ import annotations

import importlib
import logging
import os
import struct
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from entroloop.collectors.vllm.ledger import ShippedChunk

from entroloop.contract import codec
from entroloop.contract.ids import NodeStamper, new_trace_id
from entroloop.contract.records import TokenEntropy, pack_entropies, pack_token_hashes
from entroloop.contract.settings import Settings
from entroloop.infra.private_files import make_private_dir, open_private

log = logging.getLogger(__name__)

Publish = Callable[[TokenEntropy], object]
_FRAME = struct.Struct(">I")


class FileSink:
    """Appends each record as a 4-byte big-endian length + codec bytes; flushes per record."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(str(path).replace("{pid}", str(os.getpid())))
        make_private_dir(self.path.parent)  # the gateway's frames hold prompts and answers: 0700/0600
        self._lock = threading.Lock()
        self._file = open_private(self.path, "ab")  # lives as long as the engine

    def __call__(self, record: TokenEntropy) -> None:
        data = codec.encode(record)
        with self._lock:
            self._file.write(_FRAME.pack(len(data)) + data)
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()


def read_frames(path: str | Path) -> Iterator[object]:
    """Decode every record a FileSink wrote (for tests and offline replay)."""
    data = Path(path).read_bytes()
    offset = 0
    while offset + _FRAME.size <= len(data):
        (size,) = _FRAME.unpack_from(data, offset)
        offset += _FRAME.size
        yield codec.decode(data[offset : offset + size])
        offset += size


def _default_publisher(settings: Settings) -> Publish:
    """The node's Kafka publisher; without a broker configured, a frame file in DATA_DIR (said loudly)."""
    if settings.kafka_bootstrap:
        from entroloop.collectors.publisher import publisher_from_settings

        return publisher_from_settings(settings).publish
    path = Path(settings.data_dir) / "collectors" / f"tokens-{settings.node_id}-{{pid}}.bin"
    log.warning("entroloop entropy tap: ENTROLOOP_KAFKA_BOOTSTRAP is empty, writing TokenEntropy frames to %s", path)
    return FileSink(path)


def resolve_sink(spec: str, settings: Settings) -> Publish:
    """Turn an ``ENTROLOOP_ENTROPY_TAP_SINK`` value into a publish callable."""
    if spec in ("", "publisher"):
        return _default_publisher(settings)
    if spec.startswith("file:"):
        return FileSink(spec[len("file:") :])
    module_name, _, attribute = spec.partition(":")
    if not attribute:
        raise ValueError(f"ENTROLOOP_ENTROPY_TAP_SINK={spec!r}: expected publisher, file:PATH or module:attr")
    target = getattr(importlib.import_module(module_name), attribute)
    if isinstance(target, type) or getattr(target, "__code__", None) and target.__code__.co_argcount == 0:
        target = target()
    return getattr(target, "publish", target)


class TokenEntropyEmitter:
    """Builds one TokenEntropy record per shipped chunk and hands it to the sink.

    Never raises into the serving loop: a failing sink is logged and counted in ``errors``.
    """

    def __init__(self, publish: Publish, node_id: str, model: str, route: str = "default") -> None:
        self.publish = publish
        self.stamper = NodeStamper(node_id)
        self.model = model
        self.route = route
        # request id -> the route the gateway named (vllm_xargs.entroloop_route); noted at every add
        # (a preempted request is added again), dropped with the request's final chunk
        self.routes: dict[str, str] = {}
        self.emitted = 0
        self.errors = 0

    def __call__(self, chunk: ShippedChunk) -> None:
        if not chunk.values and chunk.chunk_index > 0:
            return  # nothing new since the previous chunk (e.g. preempted before a new token)
        try:
            record = self._record(chunk)
        except ValueError:  # a record the contract refuses (a bug of the tap's): never the engine's failure
            self.errors += 1
            log.exception("entroloop entropy tap: dropped the record of request %s (chunk %d): invalid",
                          chunk.request_id, chunk.chunk_index)
            return
        try:
            self.publish(record)
            self.emitted += 1
        except Exception:  # noqa: BLE001 - the serving step must not fail because a sink did
            self.errors += 1
            log.exception("entroloop entropy tap: sink failed for request %s", chunk.request_id)

    def _record(self, chunk: ShippedChunk) -> TokenEntropy:
        return TokenEntropy(
            **self.stamper.stamp(),
            request_id=chunk.request_id,
            trace_id=chunk.trace_id or new_trace_id(),
            model=self.model,
            route=self.routes.pop(chunk.request_id, self.route) if chunk.final
            else self.routes.get(chunk.request_id, self.route),
            entropies=pack_entropies(chunk.values),
            # The sampled ids themselves are the per-token hash (uint32, 4 bytes a token): a
            # detector only compares them for equality within the request, to confirm a loop.
            token_hashes=pack_token_hashes(chunk.token_ids) if chunk.token_ids else b"",
            # pre-temperature surprisals of the sampled tokens (one step late, see EntropyTap)
            surprisals=pack_entropies(chunk.surprisals) if chunk.surprisals else b"",
            # entropies at the request's sampling temperature (sampled requests only, see EntropyTap)
            sampling_entropies=pack_entropies(chunk.sampling_entropies) if chunk.sampling_entropies else b"",
            chunk_index=chunk.chunk_index,
            first_token_index=chunk.first_token_index,
            final=chunk.final,
        )
