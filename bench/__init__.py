"""Benchmarks of the commitlog: ``python -m bench.append_engine``, ``bench.sync_flush``, ``bench.append_grpc``.

See docs/benchmarks.md for the method, the machine and the results.
"""
