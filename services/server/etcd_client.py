"""etcd through its own v3 gRPC API (KV, Lease and Watch), from the stubs generated out of proto/etcd.

Only what replica leadership needs: reads, compare-and-swap transactions and leases for the commitlog's
replicas, a watch for whoever follows their leader (the gateway, ``mqstore up``). etcd does the
consensus; nothing here decides anything on its own. Every call has a deadline: a replica that cannot
reach etcd must learn it in time to stop acknowledging (:mod:`leadership`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import grpc

from etcd.api.etcdserverpb import rpc_pb2, rpc_pb2_grpc

#: Deadline of one etcd call, seconds: well under any lease TTL, so a lapse is seen before it matters.
CALL_TIMEOUT_S = 2.0


class EtcdError(RuntimeError):
    """etcd did not answer, or refused the call; the message names the endpoint."""


@dataclass(frozen=True, slots=True)
class Value:
    """One key's value and the revisions a compare-and-swap names."""

    data: bytes
    mod_revision: int
    create_revision: int
    lease: int


def compare_mod_revision(key: bytes, revision: int) -> rpc_pb2.Compare:
    """The key was last changed at ``revision`` (0: the key does not exist)."""
    return rpc_pb2.Compare(key=key, target=rpc_pb2.Compare.MOD, result=rpc_pb2.Compare.EQUAL, mod_revision=revision)


def compare_value(key: bytes, value: bytes) -> rpc_pb2.Compare:
    return rpc_pb2.Compare(key=key, target=rpc_pb2.Compare.VALUE, result=rpc_pb2.Compare.EQUAL, value=value)


def put_op(key: bytes, value: bytes, lease: int = 0) -> rpc_pb2.RequestOp:
    return rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=key, value=value, lease=lease))


def delete_op(key: bytes) -> rpc_pb2.RequestOp:
    return rpc_pb2.RequestOp(request_delete_range=rpc_pb2.DeleteRangeRequest(key=key))


class EtcdClient:
    """A blocking client of one etcd endpoint (``host:port``); thread-safe (gRPC channels are)."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self._channel = grpc.insecure_channel(endpoint)
        self._kv = rpc_pb2_grpc.KVStub(self._channel)
        self._lease = rpc_pb2_grpc.LeaseStub(self._channel)
        self._watch = rpc_pb2_grpc.WatchStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def _fail(self, what: str, exc: grpc.RpcError) -> EtcdError:
        code = exc.code().name if isinstance(exc, grpc.Call) else "UNKNOWN"
        detail = exc.details() if isinstance(exc, grpc.Call) else str(exc)
        return EtcdError(f"etcd at {self.endpoint}: {what} failed ({code}: {detail})")

    # -- keys -------------------------------------------------------------------------------
    def get(self, key: bytes) -> Value | None:
        try:
            answer = self._kv.Range(rpc_pb2.RangeRequest(key=key), timeout=CALL_TIMEOUT_S)
        except grpc.RpcError as exc:
            raise self._fail(f"reading {key.decode(errors='replace')}", exc) from None
        if not answer.kvs:
            return None
        kv = answer.kvs[0]
        return Value(kv.value, kv.mod_revision, kv.create_revision, kv.lease)

    def put(self, key: bytes, value: bytes, lease: int = 0) -> None:
        try:
            self._kv.Put(rpc_pb2.PutRequest(key=key, value=value, lease=lease), timeout=CALL_TIMEOUT_S)
        except grpc.RpcError as exc:
            raise self._fail(f"writing {key.decode(errors='replace')}", exc) from None

    def transaction(self, compare: list[rpc_pb2.Compare], success: list[rpc_pb2.RequestOp],
                    failure: list[rpc_pb2.RequestOp] | None = None) -> bool:
        """etcd's Txn: ``success`` when every comparison holds, else ``failure``; True when it held."""
        try:
            answer = self._kv.Txn(rpc_pb2.TxnRequest(compare=compare, success=success, failure=failure or []),
                                  timeout=CALL_TIMEOUT_S)
        except grpc.RpcError as exc:
            raise self._fail("a transaction", exc) from None
        return bool(answer.succeeded)

    # -- leases -----------------------------------------------------------------------------
    def grant_lease(self, ttl_s: int) -> int:
        try:
            answer = self._lease.LeaseGrant(rpc_pb2.LeaseGrantRequest(TTL=ttl_s), timeout=CALL_TIMEOUT_S)
        except grpc.RpcError as exc:
            raise self._fail(f"granting a {ttl_s} s lease", exc) from None
        if answer.error:
            raise EtcdError(f"etcd at {self.endpoint} refused a {ttl_s} s lease: {answer.error}")
        return int(answer.ID)

    def keep_alive(self, lease: int) -> int:
        """Renew ``lease`` once; its remaining TTL in seconds (0 or less: it has already expired)."""
        try:
            answers = self._lease.LeaseKeepAlive(iter([rpc_pb2.LeaseKeepAliveRequest(ID=lease)]),
                                                 timeout=CALL_TIMEOUT_S)
            for answer in answers:
                return int(answer.TTL)
        except grpc.RpcError as exc:
            raise self._fail(f"renewing lease {lease:x}", exc) from None
        return 0

    def revoke_lease(self, lease: int) -> None:
        try:
            self._lease.LeaseRevoke(rpc_pb2.LeaseRevokeRequest(ID=lease), timeout=CALL_TIMEOUT_S)
        except grpc.RpcError as exc:
            raise self._fail(f"revoking lease {lease:x}", exc) from None

    # -- watches ----------------------------------------------------------------------------
    def watch(self, key: bytes, start_revision: int = 0) -> Iterator[Value | None]:
        """Every change of ``key`` from ``start_revision`` on (0: from now): its new value, None when it
        was deleted (a lapsed lease deletes the keys attached to it). Blocks between changes; ends with
        EtcdError when the stream breaks (the caller reads the key again and watches anew)."""
        request = rpc_pb2.WatchRequest(create_request=rpc_pb2.WatchCreateRequest(key=key,
                                                                                  start_revision=start_revision))
        try:
            for answer in self._watch.Watch(iter([request])):
                if answer.canceled:
                    raise EtcdError(f"etcd at {self.endpoint} cancelled the watch of {key.decode(errors='replace')}: "
                                    f"{answer.cancel_reason or 'compacted'}")
                for event in answer.events:
                    kv = event.kv
                    yield None if event.type == event.DELETE else Value(kv.value, kv.mod_revision,
                                                                        kv.create_revision, kv.lease)
        except grpc.RpcError as exc:
            raise self._fail(f"watching {key.decode(errors='replace')}", exc) from None
        raise EtcdError(f"etcd at {self.endpoint} ended the watch of {key.decode(errors='replace')}")
