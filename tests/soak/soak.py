"""A differential soak: write through the real system while killing its services, then compare every
way of reading the store with every other (``tests/soak/divergence.py``).

One *round* (:func:`run_round`): start commitlog, indexer, query and gateway as ``mqstore up`` does;
produce through the gateway (bursts of batches and streams, single sends of nearly a whole file) while
each service is killed with SIGKILL at random points and restarted; wait for the indexer to catch
up; look every acknowledged message up through the gateway; stop everything cleanly; rebuild the
indexes twice more, with ``mqstore pipeline reindex`` and with a fresh indexer on an empty root; run
``pipeline export`` and ``pipeline verify``; compare. Then, on a copy of the stopped store, flip a
body byte of one record that has intact records after it (the commitlog's recovery quarantines it):
the online indexer, which built its unit before, voids it; a fresh indexer and ``pipeline reindex``
build after it; the three ConsumeQueues must be identical (a filler unit at the lost record's queue
offset) and the index entries too, the online indexer's less those it put for the lost record.

``tests/soak/test_differential_soak.py`` runs one short round in the small geometry, its pipeline
jobs in the suite's Spark session (``SoakOptions.spark``). ``make soak``
runs this module: rounds on one growing store for ``SOAK_MINUTES`` (default 60) in the default
geometry (or ``SOAK_GEOMETRY=small``, or ``CL_BYTES,CQ_UNITS,SLOTS,ENTRIES``), printing every
divergence; the exit code is 1 when there was one. ``SOAK_SEED`` repeats a run's random choices.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from mqstore.v1 import commitlog_pb2, commitlog_pb2_grpc, common_pb2
from services.runner import ChildSpec
from services.server.channels import sync_channel
from services.store.formats.commitlog_walk import RecordEntry, iter_commitlog, list_commitlog_files
from services.store.formats.message import TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE, TRANSACTION_TYPE_MASK
from services.store.formats.record import host_lengths, store_timestamp_pos
from tests.commitlog.commitlog_process import free_port, mqstore_command
from tests.geometry import SMALL, GeometryPreset, geometry_named
from tests.soak.divergence import (
    Findings,
    check_acknowledged,
    check_lookups,
    commitlog_records,
    compare_consume_queues,
    compare_index_items_but,
    compare_indexes,
    compare_records,
    export_rows,
    index_contents,
)
from tests.soak.workload import (
    Ledger,
    Pace,
    SoakSystem,
    create_topics,
    end_log_with_a_blank_file,
    run_workload,
    wait_caught_up,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: The checks of a round, in the order a report lists them.
CHECKS = ("workload", "caught-up", "clean-stop", "lookup-offset-id", "lookup-uniq-key", "lookup-key", "pull",
          "fresh-indexer", "consumequeue", "index", "export", "acknowledged", "verify", "corrupted-record")
#: Acknowledged messages of earlier rounds looked up again in a round.
LOOKUP_SAMPLE_EARLIER = 2000
Log = Callable[[str], None]


@dataclass(frozen=True)
class SoakOptions:
    geometry: GeometryPreset = SMALL
    seed: int = 0
    #: Producers and chaos run this long (longer until the commitlog has min_files files).
    workload_s: float = 40.0
    min_files: int = 0
    kills_per_service: int = 2
    pace: Pace = field(default_factory=Pace)
    catch_up_timeout_s: float = 60.0
    pipeline_timeout_s: float = 600.0
    spark_master: str = "local[2]"
    #: None: each pipeline job is its own ``mqstore pipeline`` process, as an operator runs it (``make
    #: soak``). A session: the jobs go through the same command line in this process, one after another,
    #: in that session (the suite's shared one: a JVM and Python workers started for each job were most
    #: of a short round's time).
    spark: SparkSession | None = None
    #: Start the round on a log that ends with a hand-built file BLANK from its first byte.
    blank_file: bool = True


@dataclass
class RoundOutcome:
    findings: Findings
    stats: dict[str, Any]


def run_round(root: Path, work: Path, options: SoakOptions, ledger: Ledger, run_id: int,
              log: Log = print) -> RoundOutcome:
    """One round on the store at ``root`` (new or left by an earlier round); scratch files in ``work``."""
    findings = Findings()
    stats: dict[str, Any] = {"seed": options.seed, "round": run_id, "geometry": options.geometry.name}
    timings: dict[str, float] = {}
    rng = random.Random(f"{options.seed}/{run_id}")
    system = SoakSystem(root, options.geometry, work / "logs")
    earlier = list(ledger.acks.values())
    started = time.monotonic()
    if options.blank_file:
        size = options.geometry.commitlog_file_size
        stats["wholly_blank_file_at"] = end_log_with_a_blank_file(root / "commitlog", size) - size
    try:
        system.start_all()
        create_topics(system.gateway)
        log(f"round {run_id}: system up on {system.gateway} (store {root}); producing for "
            f"{options.workload_s:.0f}s with kills")
        result = run_workload(system, ledger, rng, options.workload_s, run_id, options.pace,
                              options.kills_per_service, options.min_files, log=log)
        timings["workload"] = result.seconds
        findings.extend("workload", result.problems)
        findings.extend("workload", (f"{uniq}: {why}" for uniq, why in ledger.unacknowledged))
        findings.extend("workload", (f"unexpected receipt {r}" for r in ledger.strange_receipts))
        stats.update(kills=[f"{at:.1f}s {service} (up again in {up:.1f}s)" for at, service, _, up in result.kills],
                     send_failures=dict(ledger.failures))
        mark = time.monotonic()
        stuck = system.wait_indexer_caught_up(options.catch_up_timeout_s)
        if stuck:
            findings.add("caught-up", f"{stuck}\n{system.logs_tail('indexer')}")
        timings["catch-up"] = time.monotonic() - mark
        mark = time.monotonic()
        # This round's acknowledged messages, and a sample of earlier rounds' (a long soak has many).
        this_round = {a.uniq_key: a for a in list(ledger.acks.values())[len(earlier):]}
        looked_up = this_round | {a.uniq_key: a for a in rng.sample(earlier, min(len(earlier), LOOKUP_SAMPLE_EARLIER))}
        for check, details in check_lookups(system.gateway, looked_up, pulled=this_round).items():
            findings.extend(check, details)
        timings["lookups"] = time.monotonic() - mark
        codes = system.stop_all()
        findings.extend("clean-stop", (f"{name} exited with {code} on SIGTERM:\n{system.logs_tail(name)}"
                                       for name, code in codes.items() if code != 0))
        findings.extend("clean-stop", (f"{path} left after a clean stop" for path in
                                       (root / "abort", root / "indexer" / "abort", root / "query" / "abort")
                                       if path.exists()))
        offline_checks(system, work, options, ledger, findings, stats, timings, log)
        mark = time.monotonic()
        findings.extend("corrupted-record", corrupted_record_checks(system, work, options, rng, stats, log))
        timings["corrupted-record"] = time.monotonic() - mark
    finally:
        system.kill_all()
    timings["round"] = time.monotonic() - started
    stats.update(acknowledged=len(ledger.acks), attempted=len(ledger.attempted), retried=len(ledger.retried),
                 commitlog_files=len(list((root / "commitlog").iterdir())),
                 timings={k: round(v, 1) for k, v in timings.items()})
    return RoundOutcome(findings, stats)


def offline_checks(system: SoakSystem, work: Path, options: SoakOptions, ledger: Ledger, findings: Findings,
                   stats: dict[str, Any], timings: dict[str, float], log: Log) -> None:
    """With the system stopped: the pipeline jobs and a fresh indexer run side by side, then compare."""
    root, geometry = system.root, options.geometry
    # Export is incremental: each round appends what is new to the Parquet of the rounds before.
    export = root.parent / "export"
    for name in ("reindex", "fresh-indexer", "verify-report.json"):
        path = work / name
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
    mark = time.monotonic()
    jobs = {
        "reindex": [str(root), "--output", str(work / "reindex"), *geometry.reindex_args()],
        "export": [str(root), str(export)],
        "verify": [str(root), "--report", str(work / "verify-report.json")],
    }
    fresh = work / "fresh-indexer"

    def fresh_indexer() -> str | None:
        problem = rebuild_with_fresh_indexer(system, fresh, options.catch_up_timeout_s * 3)
        timings["fresh-indexer"] = time.monotonic() - mark
        return problem

    problem, outputs = run_pipeline_jobs(work, options, jobs, beside=fresh_indexer)
    if problem:
        findings.add("fresh-indexer", problem)
    timings["pipeline"] = time.monotonic() - mark
    log(f"  offline rebuilds done in {timings['pipeline']:.0f}s; comparing")
    for job, check in (("reindex", "consumequeue"), ("reindex", "index"), ("export", "export")):
        failure = outputs[job]
        if failure is not None:
            findings.add(check, failure)

    online = root / "indexer"
    findings.extend("consumequeue", compare_consume_queues("online indexer", online / "consumequeue",
                                                           "pipeline reindex", work / "reindex" / "consumequeue"))
    findings.extend("consumequeue", compare_consume_queues("online indexer", online / "consumequeue",
                                                           "fresh indexer", fresh / "consumequeue"))
    online_index = index_contents(online / "index", geometry)
    findings.extend("index", compare_indexes("online indexer", online_index, "pipeline reindex",
                                             index_contents(work / "reindex" / "index", geometry)))
    findings.extend("index", compare_indexes("online indexer", online_index, "fresh indexer",
                                             index_contents(fresh / "index", geometry)))

    records, end = commitlog_records(root)
    per_file = Counter(r.commitlog_offset // geometry.commitlog_file_size for r in records)
    stats["records"] = len(records)
    stats["densest_file_records"] = max(per_file.values(), default=0)
    stats["store_hosts"] = sorted({r.store_host for r in records})
    if not end.startswith("all zero") and "ends with a BLANK" not in end:
        findings.add("acknowledged", f"the commitlog walk ended on: {end}")
    findings.extend("export", compare_records("commitlog", records, "pipeline export", export_rows(export)))
    findings.extend("acknowledged", check_acknowledged(records, ledger))
    findings.extend("verify", verify_findings(work / "verify-report.json", outputs["verify"]))


def corrupted_record_checks(system: SoakSystem, work: Path, options: SoakOptions, rng: random.Random,
                            stats: dict[str, Any], log: Log) -> list[str]:
    """The differential check with a CRC-damaged record, on a copy of the stopped store (the store
    itself goes on intact into the next round); see the module docstring."""
    copy_dir = work / "corrupted"
    shutil.rmtree(copy_dir, ignore_errors=True)
    root = copy_dir / "store"
    shutil.copytree(system.root, root)
    victim = pick_victim(root, rng)
    if victim is None:  # the last files hold a few big records only: the online indexer builds small ones
        padding = pad_last_files(root, options, copy_dir / "padding-logs")
        if padding:
            return [padding]
        victim = pick_victim(root, rng)
    if victim is None:
        return ["no record to damage: the last three commitlog files hold none with a later record in its queue"]
    entry, body_at = victim
    flip_byte(root / "commitlog", entry.offset + body_at, options.geometry.commitlog_file_size)
    lost = (entry.offset, entry.offset + entry.size)
    stats["corrupted_record"] = f"{entry.record.topic}/{entry.record.queue_id}@{entry.record.queue_offset} at {lost}"
    log(f"  damaged the record at commitlog offset {entry.offset} of a copy; rebuilding around it")
    copy = SoakSystem(root, options.geometry, copy_dir / "logs")
    problems: list[str] = []
    try:
        copy.start("commitlog")
        ranges = [(r.start_offset, r.end_offset) for r in copy.store_info().quarantined_ranges]
        if ranges != [lost]:
            problems.append(f"the commitlog quarantined {ranges}, not the damaged record {lost}")
        copy.start("indexer")  # the online indexer: it built the record's unit before the damage
        stuck = copy.wait_indexer_caught_up(options.catch_up_timeout_s)
        codes = copy.stop_all()
        if stuck or any(codes.values()):
            return [*problems, f"online indexer on the copy: {stuck or codes}\n{copy.logs_tail('indexer')}"]
        problem, failures = run_pipeline_jobs(
            copy_dir, options, {"reindex": [str(root), "--output", str(copy_dir / "reindex"),
                                            *options.geometry.reindex_args()]},
            beside=lambda: rebuild_with_fresh_indexer(copy, copy_dir / "fresh", options.catch_up_timeout_s * 3))
    finally:
        copy.kill_all()
    problems.extend(p for p in (problem, failures["reindex"]) if p)
    online = root / "indexer"
    problems.extend(compare_consume_queues("online indexer", online / "consumequeue",
                                           "pipeline reindex", copy_dir / "reindex" / "consumequeue"))
    problems.extend(compare_consume_queues("online indexer", online / "consumequeue",
                                           "fresh indexer", copy_dir / "fresh" / "consumequeue"))
    fresh_index = index_contents(copy_dir / "fresh" / "index", options.geometry)
    problems.extend(compare_indexes("fresh indexer", fresh_index, "pipeline reindex",
                                    index_contents(copy_dir / "reindex" / "index", options.geometry)))
    problems.extend(compare_index_items_but("online indexer", index_contents(online / "index", options.geometry),
                                            "fresh indexer", fresh_index, lost))
    if not problems:
        shutil.rmtree(copy_dir, ignore_errors=True)
    return problems


def pad_last_files(root: Path, options: SoakOptions, log_dir: Path) -> str | None:
    """Append two small records to each of the last few queues of the store and have its indexer build
    their units (a workload that ended with huge records leaves the last files, which a clean start's
    recovery walks, too few records to damage one). A problem, or None."""
    last: dict[tuple[str, int], None] = {}
    for entry in iter_commitlog(root / "commitlog", check_crc=False):
        if isinstance(entry, RecordEntry) and not entry.record.topic.startswith("RMQ_SYS_"):
            key = (entry.record.topic, entry.record.queue_id)
            last.pop(key, None)
            last[key] = None
    queues = list(last)[-4:]
    system = SoakSystem(root, options.geometry, log_dir)
    try:
        system.start("commitlog")
        with sync_channel(system.addresses.commitlog) as channel:
            messages = [common_pb2.Message(topic=topic, queue_id=queue_id, body=b"padding-%d" % i)
                        for topic, queue_id in queues for i in range(2)]
            commitlog_pb2_grpc.CommitLogServiceStub(channel).AppendBatch(
                commitlog_pb2.AppendBatchRequest(messages=messages), timeout=30)
        system.start("indexer")
        stuck = system.wait_indexer_caught_up(options.catch_up_timeout_s)
        codes = system.stop_all()
    finally:
        system.kill_all()
    if stuck or any(codes.values()):
        return f"padding the copy's last files: {stuck or codes}"
    return None


def pick_victim(root: Path, rng: random.Random) -> tuple[RecordEntry, int] | None:
    """A record of the last three commitlog files (a clean start's recovery walks them) with a body and a
    later record in its queue (so every build has a unit after the lost one), and where its body starts."""
    files = list_commitlog_files(root / "commitlog")
    walked_from = files[max(0, len(files) - 3)].start_offset
    entries = [e for e in iter_commitlog(root / "commitlog", check_crc=False) if isinstance(e, RecordEntry)]
    last_of_queue = {(e.record.topic, e.record.queue_id): e.offset for e in entries}
    candidates = [e for e in entries if e.offset >= walked_from and e.record.body
                  and last_of_queue[(e.record.topic, e.record.queue_id)] > e.offset
                  and e.record.sys_flag & TRANSACTION_TYPE_MASK not in (TRANSACTION_PREPARED_TYPE,
                                                                        TRANSACTION_ROLLBACK_TYPE)]
    if not candidates:
        return None
    entry = rng.choice(candidates)
    store_host_length = host_lengths(entry.record.sys_flag)[1]
    # STORETIMESTAMP, STOREHOST, RECONSUMETIMES, PREPAREDTRANSACTIONOFFSET, BODYLENGTH, then the body
    body_at = store_timestamp_pos(entry.record.sys_flag) + 8 + store_host_length + 4 + 8 + 4
    return entry, body_at + rng.randrange(len(entry.record.body))


def flip_byte(commitlog: Path, offset: int, file_size: int) -> None:
    with open(commitlog / f"{offset - offset % file_size:020d}", "r+b") as f:
        f.seek(offset % file_size)
        byte = f.read(1)[0]
        f.seek(offset % file_size)
        f.write(bytes([byte ^ 0xFF]))


def run_pipeline_jobs(work: Path, options: SoakOptions, jobs: dict[str, list[str]],
                      beside: Callable[[], str | None]) -> tuple[str | None, dict[str, str | None]]:
    """``mqstore pipeline JOB ARGS... --master ...`` for each of ``jobs`` (job -> ARGS) while ``beside()``
    runs. Returns what ``beside`` returned and, by job, None when the job exited 0, else what it said.
    In their own processes side by side, or in ``options.spark`` one after another (see SoakOptions)."""
    master = ["--master", options.spark_master]
    if options.spark is None:
        procs = {job: start_pipeline(work, options.geometry, job, *args, *master) for job, args in jobs.items()}
        try:
            outcome = beside()
            return outcome, {job: finish_pipeline(work, job, proc, options.pipeline_timeout_s)
                             for job, proc in procs.items()}
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    with ThreadPoolExecutor(1, thread_name_prefix="soak-beside") as pool:
        running = pool.submit(beside)
        failures = {job: run_pipeline_in_session(work, options.geometry, job, *args, *master)
                    for job, args in jobs.items()}
        return running.result(), failures


def run_pipeline_in_session(work: Path, geometry: GeometryPreset, job: str, *args: str) -> str | None:
    """``mqstore pipeline JOB ARGS`` through the command line's own entry point in this process (it takes
    the active Spark session), the store's settings in a ``--config`` file, its output in the job's log."""
    from pipeline.cli import main

    settings = work / "pipeline-settings.yaml"
    settings.write_text(yaml.safe_dump(geometry.settings()))
    log = work / f"pipeline-{job}.log"
    with open(log, "w") as out, contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = main([job, *args, "--config", str(settings)])
    return None if code == 0 else pipeline_failure(work, job, f"exited with {code}")


def start_pipeline(work: Path, geometry: GeometryPreset, job: str, *args: str) -> subprocess.Popen[bytes]:
    """``mqstore pipeline JOB ARGS...`` with the store's settings in the environment, as the services had."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MQSTORE_")} | geometry.env()
    with open(work / f"pipeline-{job}.log", "wb") as out:
        return subprocess.Popen([*mqstore_command(), "pipeline", job, *args], stdout=out, stderr=out, env=env,
                                stdin=subprocess.DEVNULL)


def finish_pipeline(work: Path, job: str, proc: subprocess.Popen[bytes], timeout_s: float) -> str | None:
    """None when the job exited 0, else what it said."""
    try:
        code = proc.wait(timeout_s)
        outcome = f"exited with {code}"
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        code, outcome = -9, f"did not finish in {timeout_s:.0f}s"
    return None if code == 0 else pipeline_failure(work, job, outcome)


def pipeline_failure(work: Path, job: str, outcome: str) -> str:
    """A failed job's outcome and the last lines it wrote (Spark's warnings left out)."""
    lines = [line for line in (work / f"pipeline-{job}.log").read_text(errors="replace").splitlines()
             if "WARN" not in line and "log level" not in line.lower()]
    return f"mqstore pipeline {job} {outcome}: " + "\n".join(lines[-12:])


def verify_findings(report_path: Path, failure: str | None) -> list[str]:
    if not report_path.exists():
        return [failure or f"pipeline verify wrote no report at {report_path}"]
    report = json.loads(report_path.read_text())
    if report.get("ok") and failure is None:
        return []
    found = [f"{check}: {count} problem(s), e.g. {report['problems'].get(check, [])[:3]}"
             for check, count in report.get("problem_counts", {}).items() if count]
    return found or [failure or "pipeline verify did not report ok"]


def rebuild_with_fresh_indexer(system: SoakSystem, store: Path, timeout_s: float) -> str | None:
    """Start the stopped system's commitlog again and a new indexer on the empty ``store``; stop both
    once it has caught up. None on success, else what went wrong."""
    commitlog = system.start("commitlog")
    spec = system.specs["indexer"]
    args = list(spec.args)
    listen = f"127.0.0.1:{free_port()}"
    args[args.index("--store") + 1] = str(store)
    args[args.index("--listen") + 1] = listen
    indexer = system.spawn(ChildSpec("indexer", args, listen))
    try:
        stuck = wait_caught_up(system.addresses.commitlog, listen, timeout_s)
        if stuck:
            return f"fresh indexer: {stuck}\n" + "\n".join(indexer.logs().splitlines()[-15:])
        codes = {"fresh indexer": indexer.stop(60), "commitlog": commitlog.stop(60)}
        bad = {name: code for name, code in codes.items() if code}
        return f"unclean stop after the rebuild: {bad}" if bad else None
    finally:
        for handle in (indexer, commitlog):
            if handle.running:
                handle.kill9()


# -- make soak -----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make soak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=float(os.environ.get("SOAK_MINUTES", "60")))
    parser.add_argument("--geometry", default=os.environ.get("SOAK_GEOMETRY", "default"),
                        help="small, default, or CL_BYTES,CQ_UNITS,SLOTS,ENTRIES")
    parser.add_argument("--seed", type=int, default=int(os.environ.get("SOAK_SEED", "0")) or None)
    parser.add_argument("--round-minutes", type=float, default=float(os.environ.get("SOAK_ROUND_MINUTES", "10")),
                        help="produce this long between two comparisons")
    parser.add_argument("--dir", type=Path, default=None, help="store and scratch (default: a new temporary dir)")
    args = parser.parse_args(argv)
    try:
        geometry = geometry_named(args.geometry)
    except ValueError as exc:
        print(f"make soak: {exc}", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else random.randrange(1, 2**31)
    work = args.dir or Path(tempfile.mkdtemp(prefix="mqstore-soak-"))
    # Bodies of up to 4 MiB (maxMessageSize) when files are large: about 1 MB/s, a few rolls an hour.
    pace = Pace() if geometry.commitlog_file_size <= 4 << 20 else Pace(slow_large_share=0.05, batch_large_share=0.0)
    round_s = args.round_minutes * 60
    options = SoakOptions(geometry, seed, workload_s=min(round_s, args.minutes * 60),
                          kills_per_service=max(1, int(round_s // 120)), pace=pace,
                          catch_up_timeout_s=max(60.0, round_s / 4))
    print(f"soak: seed {seed} (SOAK_SEED={seed} repeats it), geometry {geometry}, {args.minutes:g} min, "
          f"work dir {work}", flush=True)
    ledger = Ledger()
    deadline = time.monotonic() + args.minutes * 60
    diverged = False
    run_id = 0
    while run_id == 0 or time.monotonic() < deadline:
        run_id += 1
        outcome = run_round(work / "store", work / f"round-{run_id}", options, ledger, run_id,
                            log=lambda line: print(line, flush=True))
        print(json.dumps(outcome.stats), flush=True)
        if outcome.findings:
            diverged = True
            print(outcome.findings.summary(*CHECKS), flush=True)
        else:
            print(f"round {run_id}: no divergence", flush=True)
    print(f"soak: {'DIVERGED' if diverged else 'no divergence'} after {run_id} round(s); seed {seed}; "
          f"work dir {work}", flush=True)
    return 1 if diverged else 0


if __name__ == "__main__":
    sys.exit(main())
