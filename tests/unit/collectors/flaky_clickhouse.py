"""A ClickHouse client wrapper that can be made to fail, like a server that went away."""

from __future__ import annotations

from typing import Any


class FlakyClickHouseClient:
    """Delegates ``query`` to ``client`` until ``down`` is set, then refuses the connection."""

    def __init__(self, client: Any) -> None:
        self.client, self.down = client, False

    def query(self, *args: Any, **kwargs: Any) -> Any:
        if self.down:
            raise OSError("Connection refused")
        return self.client.query(*args, **kwargs)
