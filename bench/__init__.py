"""Benchmarks that print figures (never timed asserts): the commitlog engine and service
(``mqstore.bench.append_engine``, ``mqstore.bench.sync_flush``, ``mqstore.bench.append_grpc``), dispatch
(``mqstore.bench.dispatch``, ``mqstore.bench.dispatch_lag``), the query service (``mqstore.bench.query``),
the Spark jobs (``mqstore.bench.pipeline``) and
the whole system through the gateway (``mqstore.bench.gateway``, also ``mqstore bench``).

See docs/benchmarks.md for the method, the machine and the results.
"""
