"""Shared infrastructure below the stages and above the contract, owned by no stage.

The embedded bus, Kafka topic creation and the manual-commit consumer configuration, adapter
routing state, the ClickHouse connection and migrations (``infra.clickhouse``) and the write-once
store with its file format and reader (``infra.worm``). It imports only ``entroloop.contract``.
"""
