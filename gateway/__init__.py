"""The public gRPC endpoint (issue 5): routes clients to the commitlog, indexer and query services."""
