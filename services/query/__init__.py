"""The query service: pulls, message lookups, offsets by time and consumer offsets over gRPC.

It owns no message data. ConsumeQueue units and index hits come from the indexer, record bytes from
the commitlog service (one round trip to each per request); the only file it writes is
``config/consumerOffset.json`` under its own store root. See docs/architecture.md, "Query service".
"""

DEFAULT_LISTEN = "127.0.0.1:9903"
