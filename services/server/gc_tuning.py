"""Garbage-collector settings for the services' hot paths.

Dispatch and append create many short-lived, acyclic objects (requests, tuples, results); with
CPython's default gen-0 threshold of 700 the cyclic collector runs thousands of times a second
for nothing. A larger threshold measured about 3% more dispatch throughput (docs/benchmarks.md).
"""

from __future__ import annotations

import gc

GEN0_THRESHOLD = 200_000
#: The grpc.aio servers (gateway, query service) take less: grpc.aio leaves a small reference cycle
#: behind every call (the method lookup's closure in its Cython server holds the call's metadata),
#: which only a collection frees. At 200,000 a service piled up the garbage of tens of thousands of
#: calls between collections (the query service's RSS grew for minutes, then the allocator kept the
#: pages); at 20,000 it is a few thousand calls' worth (docs/benchmarks.md, "Memory over 30 minutes").
RPC_SERVER_GEN0_THRESHOLD = 20_000


def tune_gc(gen0_threshold: int = GEN0_THRESHOLD) -> None:
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(gen0_threshold, gen1, gen2)
