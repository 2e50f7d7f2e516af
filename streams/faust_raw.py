"""A Faust schema for topics read as raw bytes, without the codec machinery per record.

The worker decodes every record itself (``entroloop.contract.codec``), so its input topics use
Faust's ``raw`` serializer, which returns the bytes it is given. Faust still runs each record's key
and value through its serializer registry (codec lookup, payload preparation, error wrapping):
~4 % of the worker's time in ``entroloop bench workers``. ``RawBytesSchema`` hands the message's
key and value bytes over as they are; the result is the same as the ``raw`` codec's. Its compiled
decoder (what a topic calls per fetched record) builds the ``Event`` with the app's event class read
once: Faust's reads it per record through ``app.conf``, whose settings descriptors cost more than
the rest of the decoding (the conductor's delivery of a record, measured in process: see
``faust_drain``).
"""

from __future__ import annotations

from typing import Any

from faust import Schema


class RawBytesSchema(Schema):
    """Key and value bytes as fetched (``None`` stays ``None``), the ``raw`` codec's output."""

    def __init__(self) -> None:
        super().__init__(key_serializer="raw", value_serializer="raw")

    def loads_key(self, app: Any, message: Any, *, loads: Any = None, serializer: Any = None) -> bytes | None:
        return message.key

    def loads_value(self, app: Any, message: Any, *, loads: Any = None, serializer: Any = None) -> bytes | None:
        return message.value

    def compile(self, app: Any, *, on_key_decode_error: Any = None, on_value_decode_error: Any = None,
                default_propagate: bool = False) -> Any:
        """The per-record decoder of a topic: ``Schema.compile``'s, whose key and value steps here
        cannot fail (bytes stay bytes), so the error callbacks are never called."""
        event_type = app.conf.Event  # what app.create_event reads per record

        async def decode(message: Any, *, propagate: bool = default_propagate) -> Any:
            return event_type(app, message.key, message.value, message.headers, message)

        return decode


__all__ = ["RawBytesSchema"]
