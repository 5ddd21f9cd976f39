"""Benchmarks that print figures (never timed asserts): the commitlog engine and service
(``bench.append_engine``, ``bench.sync_flush``, ``bench.append_grpc``), dispatch
(``bench.dispatch``, ``bench.dispatch_lag``), the query service (``bench.query``),
the Spark jobs (``bench.pipeline``) and
the whole system through the gateway (``bench.gateway``, also ``mqstore bench``).

See docs/benchmarks.md for the method, the machine and the results.
"""
