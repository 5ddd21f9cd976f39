"""The memory soak's verdict (bench/memory_soak.py): the last half's least-squares slope decides."""

from __future__ import annotations

import pytest

from bench.memory_soak import Sample, plan_clients, slope_mb_per_min, summarise


def test_slope_is_mib_per_minute() -> None:
    points = [(t, 1000 + 1024 * t / 60) for t in range(0, 600, 5)]  # 1 MiB a minute
    assert slope_mb_per_min(points) == pytest.approx(1.0)
    assert slope_mb_per_min(points[:1]) == 0.0


def test_a_service_that_levels_off_after_warming_up_is_not_growing() -> None:
    warm = [Sample(t, "query", 50_000 + min(t, 300) * 100, 30_000 + min(t, 300) * 100) for t in range(0, 1800, 5)]
    leak = [Sample(t, "gateway", 50_000 + t * 30, 30_000 + t * 30) for t in range(0, 1800, 5)]
    verdicts = {v.service: v for v in summarise(warm + leak, threshold=0.5)}
    assert verdicts["query"].verdict == "levels off" and verdicts["query"].anon_slope == pytest.approx(0.0)
    assert verdicts["gateway"].verdict == "grows" and verdicts["gateway"].anon_slope == pytest.approx(1.76, abs=0.01)
    assert verdicts["query"].rss_peak == pytest.approx((50_000 + 30_000) / 1024)


def test_the_clients_add_up_to_what_was_asked() -> None:
    plans = plan_clients("127.0.0.1:1", 64, 2, rate=1000, batch=64, lookup_rate=200, keys=10)
    total = sum(p.senders + p.batchers + len(p.consumers) + p.lookups for p in plans)
    assert total == 64
    rate = sum(p.senders * p.send_rate + p.batchers * p.batch_rate * p.batch for p in plans)
    assert rate == pytest.approx(1000)
