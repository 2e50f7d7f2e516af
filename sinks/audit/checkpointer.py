"""The audit writer's side of the anchor: sign the chain heads after sealing, keep them elsewhere.

The writer calls ``batch_sealed`` after each batch's head is written; every
``ENTROLOOP_AUDIT_CHECKPOINT_EVERY_BATCHES`` batches (and at ``close``) a checkpoint of the heads
of every chain the writer holds is signed with the key from ``ENTROLOOP_AUDIT_SIGNING_KEY_FILE``
and put in each anchor (``entroloop.infra.worm.anchors``). A checkpoint is signed only after the
heads it names are durable, so it never vouches for a batch that could still be lost.

What a checkpoint cannot prove: a writer that restarts trusts the chain it finds in the store
(it has to extend it), so a batch forged into the store while the writer was stopped is signed by
the next checkpoint. Run ``entroloop audit verify`` before restarting a writer after an incident;
``verify`` holds the log against every earlier checkpoint, so a rewrite of signed history is still
found.
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from collections.abc import Callable
from typing import Any

from entroloop.contract.settings import Settings
from entroloop.infra.worm.anchors import (
    CheckpointAnchor,
    log_name,
    require_outside_data_dir,
    writer_anchors,
)
from entroloop.infra.worm.checkpoints import (
    AnchoredHead,
    Checkpoint,
    CheckpointSigner,
    load_private_key,
)
from entroloop.infra.worm.manifest import safe_name
from entroloop.infra.worm.worm_store import WormStore


class Checkpointer:
    """Signs a checkpoint every ``every_batches`` sealed batches and puts it in every anchor."""

    def __init__(
        self,
        signer: CheckpointSigner,
        anchors: list[CheckpointAnchor],
        every_batches: int = 1,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not anchors:
            raise ValueError("a checkpointer needs at least one anchor outside the log")
        self.signer = signer
        self.anchors = anchors
        self.every_batches = every_batches
        self.clock = clock
        self.pending = 0  # batches sealed since the last checkpoint
        self.written = 0
        self.last: Checkpoint | None = None

    def batch_sealed(self, heads: list[AnchoredHead]) -> Checkpoint | None:
        self.pending += 1
        if self.pending >= self.every_batches:
            return self.checkpoint(heads)
        return None

    def checkpoint(self, heads: list[AnchoredHead]) -> Checkpoint | None:
        """Sign ``heads`` now and store the checkpoint in every anchor (nothing to sign: None)."""
        if not heads:
            return None
        checkpoint, document = self.signer.sign(heads, self.clock())
        for anchor in self.anchors:
            anchor.put(checkpoint, document)
        self.pending = 0
        self.written += 1
        self.last = checkpoint
        return checkpoint

    def close(self, heads: list[AnchoredHead]) -> Checkpoint | None:
        """Sign what was sealed since the last checkpoint, so a clean stop leaves nothing unanchored."""
        return self.checkpoint(heads) if self.pending else None

    def describe(self) -> str:
        return f"signing key {self.signer.fingerprint} -> " + ", ".join(a.describe() for a in self.anchors)


def writer_id() -> str:
    """This writer instance: host, process and a random tail (two writers never share numbers)."""
    return safe_name(f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}")


def checkpointer_from_settings(settings: Settings, store: WormStore, clickhouse_client: Any | None = None) -> Checkpointer | None:
    """The checkpointer ``ENTROLOOP_AUDIT_SIGNING_KEY_FILE`` asks for, or None when it is unset.

    ``clickhouse_client``: the caller's own client (the embedded runner owns its chDB folder); without
    one, checkpoints go to ClickHouse only when the DSN names a server."""
    if settings.audit_signing_key_file is None:
        return None
    require_outside_data_dir(settings.audit_signing_key_file, "ENTROLOOP_AUDIT_SIGNING_KEY_FILE", settings)
    key = load_private_key(settings.audit_signing_key_file)
    anchors = writer_anchors(settings, store, clickhouse_client)
    if not anchors:
        from entroloop.infra.worm.anchors import AnchorConfigError

        raise AnchorConfigError(
            "ENTROLOOP_AUDIT_SIGNING_KEY_FILE is set but the checkpoints have nowhere to go outside the log: "
            "set ENTROLOOP_AUDIT_CHECKPOINT_DIR, use a ClickHouse server (ENTROLOOP_CLICKHOUSE_DSN=http://...) "
            "or the S3 store (ENTROLOOP_AUDIT_STORE=s3)"
        )
    signer = CheckpointSigner(key, log_name(settings), writer_id())
    return Checkpointer(signer, anchors, settings.audit_checkpoint_every_batches)


__all__ = ["Checkpointer", "checkpointer_from_settings", "writer_id"]
