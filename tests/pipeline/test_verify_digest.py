"""verify's one-pass digests (pipeline/verify.py): the workers' reductions agree with the checks they
stand for. The NumPy walk of an index file's chains finds what the library's per-key query finds;
the quick report is the detailed (joins) report's on a healthy store; any disagreement hands the
store to the detailed checks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from pyspark.sql import SparkSession

from pipeline.scan import StoreInput
from pipeline.verify import CHECKS, VerifyInputs, _pair_digest, digest_index, quick_verify, reachable_entries
from services.store.formats.geometry import GeometryOptions
from tests.conftest import StoreFactory
from tests.pipeline.services_store import ServicesStore


def _inputs(store: Path, config: Path | None = None) -> VerifyInputs:
    options = GeometryOptions(str(config)) if config is not None else None
    return VerifyInputs.of(StoreInput.open(store, options))


def test_numpy_chain_walk_finds_what_the_query_finds(pristine_store: StoreFactory,
                                                     services_store: ServicesStore) -> None:
    for inputs in (_inputs(pristine_store("normal-raw")), _inputs(pristine_store("crash-recovered")),
                   _inputs(services_store.root, services_store.config)):
        assert inputs.index_files
        for path in inputs.index_files:
            pairs = sorted(set(reachable_entries(path, inputs.hash_slot_num, inputs.index_num)))
            hashes, offsets = np.array([h for h, _ in pairs], np.int64), np.array([o for _, o in pairs], np.int64)
            expected = _pair_digest(hashes, offsets)
            assert digest_index(path, inputs.hash_slot_num, inputs.index_num) == expected != (0, 0)


def test_the_quick_report_of_a_healthy_store(spark: SparkSession, pristine_store: StoreFactory) -> None:
    """What the detailed checks report on this store (test_reindex_verify.py), from the digests alone
    (one run on a loaded machine: 26 s against 155 s for the joins, equal reports)."""
    quick = quick_verify(spark, _inputs(pristine_store("normal-raw")), 300_000)
    assert quick is not None and quick.ok
    assert (quick.records, quick.record_bytes, quick.cq_units, quick.index_files) == (3000, 2965274, 3000, 16)
    assert set(quick.counts) == {*CHECKS, "commitlog-damage", "consumequeue-files"} and quick.samples == {}


def test_a_disagreement_hands_over_to_the_detailed_checks(spark: SparkSession, fixture_store: StoreFactory) -> None:
    """One unit's tags code changed: the digests differ (the joins then name the unit, as
    test_reindex_verify.py's damaged stores show)."""
    store = fixture_store("normal-raw")
    queue_file = sorted((store / "consumequeue" / "TopicA" / "0").iterdir())[0]
    data = bytearray(queue_file.read_bytes())
    data[12:20] = (12345).to_bytes(8, "big")
    queue_file.write_bytes(bytes(data))
    assert quick_verify(spark, _inputs(store), 300_000) is None
