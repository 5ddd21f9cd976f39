"""The peer harness's table logic (bench/peer_table.py, bench/peers.py): which figure a ratio divides,
when a goal is met, medians of reps, --only. No server is started: the harness itself runs by hand
(``make bench-peers``)."""

from __future__ import annotations

import pytest

from bench import peers
from bench.peer_table import Goal, Measure, Row, issue_rows, render, select, to_json


def rate_row(goal: Goal, ours: float, redis: float | None = None, failed: int = 0) -> Row:
    return Row("r", "produce", "produce", "rate", goal, mqstore=Measure(rate=ours, failed=failed),
               redis=Measure(rate=redis) if redis is not None else None, nats=Measure(rate=ours * 2))


def test_rate_ratio_is_mqstore_over_the_peer() -> None:
    row = rate_row(Goal(min_vs_redis=1.0), ours=60_000, redis=120_000)
    assert row.ratio(row.redis) == pytest.approx(0.5)
    assert row.ratio(row.nats) == pytest.approx(0.5)
    assert row.verdict() == (False, "0.50× Redis")
    assert rate_row(Goal(min_vs_redis=1.0), ours=120_000, redis=120_000).verdict() == (True, "")


def test_a_goal_against_redis_without_a_redis_figure_is_undecided() -> None:
    assert rate_row(Goal(min_vs_redis=1.0), ours=1.0).verdict() == (None, "no Redis figure")


def test_every_bound_must_hold() -> None:
    row = rate_row(Goal(min_rate=250_000, min_vs_redis=0.6), ours=260_000, redis=500_000)
    assert row.verdict() == (False, "0.52× Redis")
    row = rate_row(Goal(min_rate=250_000, min_vs_redis=0.6), ours=240_000, redis=300_000)
    assert row.verdict() == (False, "96% of the rate")
    assert rate_row(Goal(min_rate=250_000, min_vs_redis=0.6), ours=260_000, redis=300_000).verdict()[0] is True


def test_failures_are_never_met() -> None:
    met, why = rate_row(Goal(min_rate=10), ours=1_000_000, failed=3).verdict()
    assert met is False and "3 failed" in why


def test_latency_rows() -> None:
    goal = Goal(max_p50_ms=0.4, max_p99_ms=1.0)
    row = Row("get-1", "get", "get", "latency", goal, mqstore=Measure(p50_ms=0.3, p99_ms=1.5),
              redis=Measure(p50_ms=0.1, p99_ms=0.2))
    assert row.ratio(row.redis) == pytest.approx(3.0)  # latency: 3x slower
    assert row.verdict() == (False, "p99 1.50 ms")
    row.mqstore = Measure(p50_ms=0.3, p99_ms=0.9)
    assert row.verdict() == (True, "")
    assert Row("x", "get", "x", "latency", goal).verdict() == (None, "not run")


def test_seconds_rows() -> None:
    row = Row("recovery", "recovery", "recovery", "seconds", Goal(max_seconds=2.0), mqstore=Measure(seconds=1.2))
    assert row.verdict() == (True, "")
    row.mqstore = Measure(seconds=2.5)
    assert row.verdict() == (False, "2.50 s")


def test_median_of_reps() -> None:
    reps = [Measure(rate=r, p50_ms=p, mode="m", failed=f, ops=10) for r, p, f in ((1, 5, 0), (3, 1, 1), (2, 3, 0))]
    median = Measure.median(reps)
    assert (median.rate, median.p50_ms, median.p99_ms) == (2, 3, None)
    assert (median.failed, median.ops, median.mode) == (1, 30, "m")


def test_issue_rows_and_only() -> None:
    rows = issue_rows()
    assert len({r.key for r in rows}) == len(rows) == 19
    assert [r.key for r in select(rows, "get,recovery")] == ["get-1", "get-n", "recovery"]
    assert [r.key for r in select(rows, "key-1")] == ["key-1"]
    assert select(rows, None) == rows
    with pytest.raises(ValueError, match="unknown rows"):
        select(rows, "produce,bogus")


def test_render_and_json() -> None:
    rows = select(issue_rows(), "pull")
    rows[0].mqstore = Measure(rate=300_000, mode="Pull 1024, raw_records")
    rows[0].redis = Measure(rate=400_000)
    rows[0].notes.append("a note")
    text = render(rows)
    assert "| pull / read a range | 300k/s [Pull 1024, raw_records] | 400k/s | — | — | 0.75× | — | — |" in text
    assert "**met**" in text and "- pull / read a range: a note" in text
    assert '"met": true' in to_json(rows, {"quick": True})


def test_per_call_rows_stand_against_the_unary_floor_at_the_same_calls_in_flight() -> None:
    rows = {r.key: r for r in issue_rows()}
    assert rows["get-1"].floor_case == rows["send-latency"].floor_case == rows["key-1"].floor_case == "unary-1"
    assert {rows[k].floor_case for k in ("get-n", "key-n", "time", "send-n")} == {"unary-n"}
    assert {rows[k].floor_case for k in ("produce-batch256", "produce-stream", "durable-batch64", "pull")} == {"stream"}
    get = rows["get-1"]
    get.floor = Measure(rate=5000, p50_ms=0.2, p99_ms=0.3)
    get.mqstore = Measure(rate=4000, p50_ms=0.25, p99_ms=0.5)
    assert get.vs_floor() == pytest.approx((1.25, 0.8))
    assert get.verdict() == (True, "")
    get.mqstore = Measure(rate=1000, p50_ms=0.3, p99_ms=0.5)
    met, why = get.verdict()
    assert not met and "p50 1.5× floor" in why and "0.20× floor rate" in why
    get.floor = None
    assert get.verdict() == (None, "no floor figure")


def test_floor_rows_show_the_floor_and_have_no_verdict() -> None:
    rows = select(issue_rows(), "floor,get-1")
    floor = next(r for r in rows if r.key == "floor-unary")
    floor.floor = Measure(rate=5000, p50_ms=0.19, p99_ms=0.31, mode="unary echo")
    get = next(r for r in rows if r.key == "get-1")
    get.floor, get.mqstore = floor.floor, Measure(rate=1000, p50_ms=0.95, p99_ms=1.5, mode="GetMessage")
    assert floor.verdict() == (None, "the floor")
    text = render(rows)
    assert ("| floor: bare grpc.aio unary echo, 1 KiB each way, one in flight | — | — | — "
            "| p50 0.19 / p99 0.31 ms") in text
    assert "| 5.0× p50 |" in text
    assert '"p50VsFloor": 5.0' in to_json(rows, {})


def test_cli_parses_and_quick_shrinks(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        peers.main(["--help"])
    assert exit_info.value.code == 0
    assert "Redis Streams" in capsys.readouterr().out
    args = peers.build_parser().parse_args(["--quick", "--duration", "5"])
    peers.apply_quick(args)
    assert args.duration == 1.0 and args.preload <= 8192 and args.recovery_gib < 1
    with pytest.raises(SystemExit):
        peers.main(["--only", "nope", "--no-install"])


def test_recovery_table_is_parsed() -> None:
    out = ("| case | rep | scanned GiB | records | walk s | walk CPU s | s/GiB | queue table rebuild s | start() s |"
           " cpu other |\n| abnormal | 1 | 2.00 | 3,303,936 | 1.71 | 1.60 | 0.86 | - | 1.90 | 0.02 |\n")
    assert peers.RECOVERY_REP.findall(out) == [("2.00", "3,303,936", "1.71")]
