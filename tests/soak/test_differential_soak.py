"""Correct at any size: one differential soak round on a small geometry (tests/soak/soak.py).

The real system (commitlog, indexer, query, gateway as ``mqstore up`` starts them) starts on a log
whose first file is BLANK from its first byte and takes ~40 s of producers: fast (batches, streams),
slow (single messages, many nearly a whole 1 MiB commitlog file, so BLANK fillers end most files),
and once a file of thousands of tiny records; meanwhile each service is killed with SIGKILL twice at
random points and restarted (the commitlog under another store host each time, one of them IPv6).
Then every way of reading the store must agree with every other, also on a copy of it with one
CRC-damaged record. Each test below is one comparison
of that one round; a failure prints the divergences and the seed (``SOAK_SEED=<seed>`` repeats the
random choices). Select with ``-m soak``; ``make soak`` runs the long version.
"""

from __future__ import annotations

import dataclasses
import os
import random
from typing import TYPE_CHECKING

import pytest

from pipeline.export import BATCH_ROWS
from tests.geometry import SMALL
from tests.soak.soak import RoundOutcome, SoakOptions, run_round
from tests.soak.workload import Ledger

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: The round takes about 3 minutes on 2 idle cores; the limit leaves room for a busy machine.
pytestmark = [pytest.mark.soak, pytest.mark.timeout(600)]

MIN_COMMITLOG_FILES = 30
#: SMALL's ConsumeQueue and index files with 1 MiB commitlog files (the top of the small range), so that
#: one file can hold more records than an export batch: "correct at any size" includes a dense file.
GEOMETRY = dataclasses.replace(SMALL, name="small-1MiB", commitlog_file_size=1024 * 1024)


@pytest.fixture(scope="module")
def soak(tmp_path_factory: pytest.TempPathFactory, spark: SparkSession) -> RoundOutcome:
    """The round, its pipeline jobs run in the suite's Spark session (``make soak`` runs each in its own
    process)."""
    seed = int(os.environ.get("SOAK_SEED", "0")) or random.randrange(1, 2**31)
    print(f"\nsoak seed {seed} (SOAK_SEED={seed} repeats it)")
    work = tmp_path_factory.mktemp("soak")
    options = SoakOptions(GEOMETRY, seed, workload_s=40.0, min_files=MIN_COMMITLOG_FILES, kills_per_service=2,
                          pipeline_timeout_s=300.0, spark=spark)
    outcome = run_round(work / "store", work, options, Ledger(), run_id=1)
    print(outcome.stats)
    return outcome


def divergences(outcome: RoundOutcome, *checks: str) -> str:
    return f"seed {outcome.stats['seed']}, {outcome.stats}\n{outcome.findings.summary(*checks)}"


def test_the_workload_ran_as_planned(soak: RoundOutcome) -> None:
    """Every service killed and back, every send acknowledged in the end, ≥ 30 commitlog files, the
    indexer caught up, and every service stopped cleanly by SIGTERM."""
    assert not soak.findings.of("workload", "caught-up", "clean-stop"), \
        divergences(soak, "workload", "caught-up", "clean-stop")
    assert sorted(kill.split()[1] for kill in soak.stats["kills"]) == sorted(
        ["commitlog", "indexer", "query", "gateway"] * 2)
    assert soak.stats["commitlog_files"] >= MIN_COMMITLOG_FILES
    assert soak.stats["densest_file_records"] > BATCH_ROWS, soak.stats
    hosts = soak.stats["store_hosts"]  # each commitlog start writes under the next store host
    assert len(hosts) == 3 and any(h.startswith("[") for h in hosts), hosts


def test_consume_queues_are_byte_identical_to_reindex_and_a_fresh_indexer(soak: RoundOutcome) -> None:
    assert not soak.findings.of("consumequeue", "fresh-indexer"), divergences(soak, "consumequeue", "fresh-indexer")


def test_index_entries_equal_reindex_and_a_fresh_indexer(soak: RoundOutcome) -> None:
    assert not soak.findings.of("index", "fresh-indexer"), divergences(soak, "index", "fresh-indexer")


def test_a_quarantined_record_gets_the_same_filler_unit_online_from_reindex_and_a_fresh_indexer(
        soak: RoundOutcome) -> None:
    """On a copy of the store with one CRC-damaged record: the commitlog quarantines it and the online
    indexer (which had built its unit), ``pipeline reindex`` and a fresh indexer build the same queues."""
    assert "corrupted_record" in soak.stats, soak.stats
    assert not soak.findings.of("corrupted-record"), divergences(soak, "corrupted-record")


def test_export_rows_are_the_commitlog_records(soak: RoundOutcome) -> None:
    assert not soak.findings.of("export"), divergences(soak, "export")


def test_the_commitlog_holds_every_acknowledged_message_and_only_sent_ones(soak: RoundOutcome) -> None:
    assert not soak.findings.of("acknowledged"), divergences(soak, "acknowledged")


def test_pipeline_verify_passes(soak: RoundOutcome) -> None:
    assert not soak.findings.of("verify"), divergences(soak, "verify")


@pytest.mark.parametrize("check", ["lookup-offset-id", "lookup-uniq-key", "lookup-key", "pull"])
def test_every_acknowledged_message_is_found_through_the_gateway(soak: RoundOutcome, check: str) -> None:
    assert not soak.findings.of(check), divergences(soak, check)

