"""A Faust schema for topics read as raw bytes, without the codec machinery per record.

The worker decodes every record itself (``entroloop.contract.codec``), so its input topics use
Faust's ``raw`` serializer, which returns the bytes it is given. Faust still runs each record's key
and value through its serializer registry (codec lookup, payload preparation, error wrapping):
~4 % of the worker's time in ``entroloop bench workers``. ``RawBytesSchema`` hands the message's
key and value bytes over as they are; the result is the same as the ``raw`` codec's.
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


__all__ = ["RawBytesSchema"]
