"""Replication of the CommitLog on RocketMQ 4.9.8's HA wire protocol (docs/replication.md).

The leader's :mod:`ha_service` streams its commitlog to every connected follower from the offset the
follower reports; a follower's :mod:`ha_client` appends what it receives at exactly the reported
physical offsets (:mod:`replica_append`). Under SYNC_MASTER a put is acknowledged only once enough
in-sync followers hold it (:mod:`group_transfer`). Between mqstore replicas an authenticated
:mod:`handshake` comes before any offset counts.
"""
