"""The ClickHouse connection (server over HTTP or chDB in-process) and the schema migrations."""
