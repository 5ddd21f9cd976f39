"""Power cuts of the whole store behind a running gateway (tests/powercut/gateway_campaign.py): under
SYNC_FLUSH, ``POWERCUT_GATEWAY_CUTS`` cuts (50 by default; every fifth while the services recover)
lose nothing acknowledged: sends (pull, offset msg id, UNIQ_KEY), queue offsets, topics, consumer
offsets, delay-level, timer and transactional messages (each delivered once), and ``pipeline verify``
finds the final store consistent (in the suite's Spark session: tests/conftest.py's ``spark``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.powercut.gateway_campaign import run_campaign
from tests.powercut.mount import available

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

CUTS = int(os.environ.get("POWERCUT_GATEWAY_CUTS", "50"))
UNAVAILABLE = available()
pytestmark = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"no FUSE here: {UNAVAILABLE}")


@pytest.mark.timeout(1200)  # about 2 minutes on a quiet two-core machine, several times that on a busy one
def test_nothing_acknowledged_through_the_gateway_is_lost_at_power_cuts(tmp_path: Path, spark: SparkSession) -> None:
    result = run_campaign(tmp_path / "campaign", CUTS, seed=24, spark=spark)
    print(f"gateway power-cut campaign: {result.summary()}")
    assert not result.lost, f"lost after a power cut: {result.summary()}: {result.lost[:10]}"
    assert result.cuts + result.cuts_starting >= CUTS and result.cuts_starting > 0
    assert result.sends > CUTS and result.rolls > 0
