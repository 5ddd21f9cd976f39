"""The indexer tests run real commitlog processes too: the same fixtures as tests/commitlog."""

from tests.commitlog.conftest import module_start_commitlog, start_commitlog

__all__ = ["module_start_commitlog", "start_commitlog"]
