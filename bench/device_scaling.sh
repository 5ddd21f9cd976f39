#!/usr/bin/env bash
# Replication and gateway-process scaling on a lent many-core machine with no network (and no venv).
#
#     bash bench/device_scaling.sh          # from the repository root, with .devbundle/ beside it
#
# .devbundle/ (git-ignored, made by hand for the run) holds what such a machine lacks: whl/ (cp312
# manylinux wheels of the pinned runtime dependencies, installed here with --target, no index), gen/
# (the generated protobuf code, so no grpc_tools is needed), bin/etcd.xz, bin/nats-server.xz and
# bin/redis.tar.xz (redis-server and the shared libraries it links, used by redis-server alone).
# To build it: `pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
# --platform manylinux2014_x86_64 -d .devbundle/whl NAME==VERSION` for each runtime dependency pinned in
# requirements.lock (and redis, hiredis, nats-py), `cp -r gen .devbundle/gen` (again after a proto change),
# `xz -9c /usr/bin/etcd > .devbundle/bin/etcd.xz` (likewise nats-server), and redis-server with the
# libraries `ldd` lists in a tar.xz; add `/.devbundle/` to .git/info/exclude.
#
# Two stages, each under a hard time limit (every process a stage started, orphans included, is stopped
# by PID when it ends), full output into $OUT (default /tmp/out), a summary table printed last:
#   1. python -m bench.replication --systems S --kills K --seconds $REPL_SECONDS --json, for S in $SYSTEMS
#      (K = $KILLS for mqstore, 0 for the others: the failover part is mqstore's alone)
#   2. python -m bench.gateway --gateway-workers N for N in $WORKERS (cases $GW_CASES, $GW_DURATION s)
# Knobs (environment): SYSTEMS (default mqstore,redis,nats, cut to what runs here), KILLS (3),
# REPL_SECONDS (4), REPL_PRODUCERS (8), REPL_SPLIT (1: one bench.replication per system, the failover with mqstore's),
# REPL_TIMEOUT_MQSTORE/_REDIS/_NATS (150/60/75 s), GW_RESERVE (190 s kept for stage 2),
# WORKERS ("1 2 4 8"), GW_CASES (batch,pull), GW_BATCH (256),
# GW_DURATION (3), GW_PROCS (6), GW_INFLIGHT (4), GW_PULL_PROCS (6), GW_PULL_INFLIGHT (4),
# GW_PRELOAD (100000), GW_TIMEOUT (70, per worker count), TOTAL_BUDGET (480 s for the whole script),
# STAGES ("replication gateway"), DEV_ROOT (/tmp: site/, bin/, redis/, mqstore-bench-tmp/),
# BUNDLE (.devbundle), WHEELS ($BUNDLE/whl), SCRATCH_DIR (where the benches' stores go).
# (Not SECONDS: bash keeps its own clock in that variable.)
set -u
START_EPOCH=$(date +%s)
REPO=$(pwd)
OUT=${OUT:-/tmp/out}
BUNDLE=${BUNDLE:-$REPO/.devbundle}
WHEELS=${WHEELS:-$BUNDLE/whl}
DEV_ROOT=${DEV_ROOT:-/tmp}
SITE=$DEV_ROOT/site
BIN=$DEV_ROOT/bin
SCRATCH_DIR=${SCRATCH_DIR:-$DEV_ROOT/mqstore-bench-tmp}
TOTAL_BUDGET=${TOTAL_BUDGET:-480}
STAGES=${STAGES:-replication gateway}
SYSTEMS=${SYSTEMS:-mqstore,redis,nats}
KILLS=${KILLS:-3}
REPL_SECONDS=${REPL_SECONDS:-4}
REPL_PRODUCERS=${REPL_PRODUCERS:-8}
REPL_SPLIT=${REPL_SPLIT:-1}
REPL_TIMEOUT_MQSTORE=${REPL_TIMEOUT_MQSTORE:-150}
REPL_TIMEOUT_REDIS=${REPL_TIMEOUT_REDIS:-60}
REPL_TIMEOUT_NATS=${REPL_TIMEOUT_NATS:-75}
WORKERS=${WORKERS:-1 2 4 8}
GW_CASES=${GW_CASES:-batch,pull}
GW_BATCH=${GW_BATCH:-256}
GW_DURATION=${GW_DURATION:-3}
GW_PROCS=${GW_PROCS:-6}
GW_INFLIGHT=${GW_INFLIGHT:-4}
GW_PULL_PROCS=${GW_PULL_PROCS:-6}
GW_PULL_INFLIGHT=${GW_PULL_INFLIGHT:-4}
GW_PRELOAD=${GW_PRELOAD:-100000}
GW_TIMEOUT=${GW_TIMEOUT:-70}
case " $STAGES " in *" gateway "*) GW_RESERVE=${GW_RESERVE:-190} ;; *) GW_RESERVE=${GW_RESERVE:-15} ;; esac
PY=$(command -v python3)
mkdir -p "$OUT" "$SITE" "$BIN" "$SCRATCH_DIR"

step() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - START_EPOCH ))s] $*"; }
left() { echo $(( START_EPOCH + TOTAL_BUDGET - $(date +%s) )); }
min() { if [ "$1" -lt "$2" ]; then echo "$1"; else echo "$2"; fi; }

# -- install ---------------------------------------------------------------------------------------
step "installing $(ls "$WHEELS"/*.whl 2>/dev/null | wc -l) wheels from $WHEELS into $SITE"
if ! timeout 120 "$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile \
        --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl; then
    step "pip install failed: unpacking the wheels into $SITE directly"
    timeout 120 "$PY" - "$SITE" "$WHEELS"/*.whl <<'EOF'
import sys, zipfile
for wheel in sys.argv[2:]:
    zipfile.ZipFile(wheel).extractall(sys.argv[1])
EOF
fi
GEN=$BUNDLE/gen
[ -d "$GEN" ] || GEN=$REPO/gen
export PYTHONPATH=$SITE:$REPO:$GEN
export PYTHONUNBUFFERED=1
unset PYTHONHOME || true

step "unpacking the binaries into $BIN"
# With Python's lzma: the image may have no xz.
for name in etcd nats-server; do
    if [ -f "$BUNDLE/bin/$name.xz" ]; then
        "$PY" -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
            "$BUNDLE/bin/$name.xz" "$BIN/$name" && chmod +x "$BIN/$name"
    fi
done
if [ -f "$BUNDLE/bin/redis.tar.xz" ]; then
    rm -rf "$DEV_ROOT/redis"
    "$PY" -c 'import sys, tarfile; t = tarfile.open(sys.argv[1], "r:xz"); t.extractall(sys.argv[2], **({"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}))' \
        "$BUNDLE/bin/redis.tar.xz" "$DEV_ROOT"
    # Its libraries (Debian 12's) for redis-server alone: the rest of the machine keeps its own.
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%s/redis/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec %s/redis/redis-server "$@"\n' \
        "$DEV_ROOT" "$DEV_ROOT" > "$BIN/redis-server"
    chmod +x "$BIN/redis-server"
fi
# The benches start `mqstore` as the one beside sys.executable, else <repo>/.venv/bin/mqstore.
printf '#!/bin/sh\nPYTHONPATH=%s${PYTHONPATH:+:$PYTHONPATH} exec %s -m services.cli "$@"\n' \
    "$SITE:$REPO:$GEN" "$PY" > "$BIN/mqstore"
chmod +x "$BIN/mqstore"
if [ ! -e "$REPO/.venv/bin/python" ]; then
    mkdir -p "$REPO/.venv/bin" && cp "$BIN/mqstore" "$REPO/.venv/bin/mqstore"
else
    step "WARNING: $REPO/.venv exists: the benches will start its mqstore, not $BIN/mqstore"
fi
export PATH=$BIN:$PATH
# The benches keep their stores under <repo>/.bench-tmp: make that the scratch disk.
if [ -L "$REPO/.bench-tmp" ] || [ ! -e "$REPO/.bench-tmp" ] || rmdir "$REPO/.bench-tmp" 2>/dev/null; then
    ln -sfn "$SCRATCH_DIR" "$REPO/.bench-tmp"
else
    step "WARNING: $REPO/.bench-tmp is a non-empty directory: the stores go there, not to $SCRATCH_DIR"
fi
ulimit -n 65536 2>/dev/null || ulimit -n 4096 2>/dev/null || true

# A stage runner: the command in its own process group under a time limit (SIGINT to the group, so the
# benches stop their servers, then SIGKILL); as a child subreaper it also stops, by PID, whatever the
# command left behind (orphans of its servers included) once it ends.
cat > "$DEV_ROOT/stage_runner.py" <<'EOF'
import ctypes, os, signal, subprocess, sys, time

limit, grace, cmd = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3:]
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans of the stage come to us
me = os.getpid()

def descendants():
    parent = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
                if state != "Z":  # a zombie is reaped, not stopped
                    parent[int(entry)] = int(ppid)
            except (OSError, ValueError, IndexError):
                pass
    found, todo = [], [me]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        found += kids
        todo += kids
    return found

def reap():
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass

def sweep(sig, wait_s):
    pids = descendants()
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass
    end = time.monotonic() + wait_s
    while pids and time.monotonic() < end:
        reap()
        pids = [p for p in pids if os.path.exists(f"/proc/{p}") and p in descendants()]
        time.sleep(0.2)
    return pids

def on_term(*_):
    raise KeyboardInterrupt

signal.signal(signal.SIGTERM, on_term)
proc = subprocess.Popen(cmd, start_new_session=True)
code = None
try:
    code = proc.wait(limit)
except subprocess.TimeoutExpired:
    print(f"\n[stage_runner] TIMEOUT after {limit:.0f} s: SIGINT to the stage", flush=True)
except KeyboardInterrupt:
    print("\n[stage_runner] stopped: SIGINT to the stage", flush=True)
if code is None:
    try:
        os.killpg(proc.pid, signal.SIGINT)
    except OSError:
        pass
    try:
        code = proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    code = 124
reap()
left = descendants()
if left:
    def cmdline(pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:160]
        except OSError:
            return "?"
    print(f"[stage_runner] {len(left)} processes left behind, SIGTERM then SIGKILL: "
          + "; ".join(f"{p} {cmdline(p)}" for p in left), flush=True)
    if sweep(signal.SIGTERM, 10):
        sweep(signal.SIGKILL, 5)
reap()
sys.exit(code if code >= 0 else 128 - code)
EOF
stage() {  # stage LIMIT_S CMD...: the stage runner under an outer timeout as a last resort
    local limit=$1; shift
    timeout -k 10 $(( limit + 60 )) "$PY" -u "$DEV_ROOT/stage_runner.py" "$limit" 30 "$@"
}

# -- the machine -----------------------------------------------------------------------------------
step "machine"
echo "nproc: $(nproc)   $("$PY" --version 2>&1) at $PY   pip: $("$PY" -m pip --version 2>/dev/null | cut -d' ' -f1-2)"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
free -g 2>/dev/null || grep -E 'MemTotal|MemAvailable' /proc/meminfo
echo "kernel: $(uname -r)   loadavg: $(cat /proc/loadavg)"
df -hT "$REPO" "$DEV_ROOT" "$SCRATCH_DIR" 2>/dev/null
findmnt -T "$SCRATCH_DIR" 2>/dev/null | tail -1
"$PY" - <<'EOF'
import importlib
for name in ("grpc", "google.protobuf", "numpy", "yaml", "isal", "opentelemetry.sdk.version", "prometheus_client",
             "tenacity", "redis", "hiredis", "nats"):
    try:
        m = importlib.import_module(name)
        print(f"  {name:26} {getattr(m, '__version__', '?'):12} {getattr(m, '__file__', '')}")
    except Exception as exc:
        print(f"  {name:26} MISSING ({type(exc).__name__}: {exc})")
EOF
if ! "$PY" -c 'import services.cli, gateway, bench.replication, bench.gateway, mqstore.client, mqstore.v1.commitlog_pb2'; then
    step "FATAL: the project does not import with PYTHONPATH=$PYTHONPATH"
    exit 1
fi
for b in etcd nats-server redis-server mqstore; do
    printf '  %-13s %s  %s\n' "$b" "$(command -v $b)" "$(timeout 20 $b --version 2>&1 | head -1)"
done

# -- 1. replication --------------------------------------------------------------------------------
run_replication() {
    local systems="mqstore" system limit cap kills
    case ",$SYSTEMS," in *,redis,*)
        if timeout 20 redis-server --version >/dev/null 2>&1 && "$PY" -c 'import redis, hiredis' 2>/dev/null; then
            systems="$systems,redis"; else step "redis-server or its client does not run here: no redis rows"; fi;; esac
    case ",$SYSTEMS," in *,nats,*)
        if timeout 20 nats-server --version >/dev/null 2>&1 && "$PY" -c 'import nats' 2>/dev/null; then
            systems="$systems,nats"; else step "nats-server or nats-py does not run here: no nats rows"; fi;; esac
    : > "$OUT/replication.log"
    # REPL_SPLIT=1: one bench.replication per system (its table and JSON are printed at its end: a system
    # that fails or times out loses its own rows only); 0: one run of them all, as `make bench-replication`.
    local runs="$systems"
    [ "$REPL_SPLIT" = 1 ] && runs=${systems//,/ }
    for system in $runs; do
        case $system in mqstore*) limit=$REPL_TIMEOUT_MQSTORE; kills=$KILLS ;;
                        redis) limit=$REPL_TIMEOUT_REDIS; kills=0 ;;
                        nats) limit=$REPL_TIMEOUT_NATS; kills=0 ;; esac
        [ "$REPL_SPLIT" = 1 ] || limit=$(( REPL_TIMEOUT_MQSTORE + REPL_TIMEOUT_REDIS + REPL_TIMEOUT_NATS ))
        cap=$(( $(left) - GW_RESERVE ))
        limit=$(min "$limit" "$cap")
        if [ "$limit" -lt 30 ]; then step "replication $system: no time left, skipped" | tee -a "$OUT/replication.log"; continue; fi
        step "replication: --systems $system --kills $kills --seconds $REPL_SECONDS --producers $REPL_PRODUCERS (limit ${limit}s)" | tee -a "$OUT/replication.log"
        stage "$limit" "$PY" -m bench.replication --systems "$system" --kills "$kills" --seconds "$REPL_SECONDS" \
            --producers "$REPL_PRODUCERS" --json \
            2>&1 | tee -a "$OUT/replication.log" | grep -v '^{"rows"'
        step "replication $system: exit ${PIPESTATUS[0]}" | tee -a "$OUT/replication.log"
    done
}

# -- 2. gateway processes --------------------------------------------------------------------------
run_gateway() {
    : > "$OUT/gateway_scaling.log"
    local n count todo=0 limit
    for n in $WORKERS; do todo=$(( todo + 1 )); done
    for n in $WORKERS; do
        limit=$(min "$GW_TIMEOUT" $(( ($(left) - 15) / todo )))
        todo=$(( todo - 1 ))
        if [ "$limit" -lt 20 ]; then step "gateway workers $n: no time left, skipped" | tee -a "$OUT/gateway_scaling.log"; continue; fi
        step "gateway: --gateway-workers $n, cases $GW_CASES, ${GW_DURATION}s a case (limit ${limit}s)" | tee -a "$OUT/gateway_scaling.log"
        echo "=== gateway-workers $n ===" >> "$OUT/gateway_scaling.log"
        stage "$limit" "$PY" -m bench.gateway --gateway-workers "$n" --cases "$GW_CASES" --batch "$GW_BATCH" \
            --reps 1 --duration "$GW_DURATION" --procs "$GW_PROCS" --inflight "$GW_INFLIGHT" \
            --pull-procs "$GW_PULL_PROCS" --pull-inflight "$GW_PULL_INFLIGHT" --preload "$GW_PRELOAD" \
            --settle 10 --wait-quiet 1 --quiet --json 2>&1 | tee -a "$OUT/gateway_scaling.log" | grep -v '^{"bench"'
        step "gateway workers $n: exit ${PIPESTATUS[0]}" | tee -a "$OUT/gateway_scaling.log"
    done
}

for s in $STAGES; do
    case $s in
        replication) run_replication ;;
        gateway) run_gateway ;;
        *) step "unknown stage $s" ;;
    esac
done
rm -rf "${SCRATCH_DIR:?}"/* 2>/dev/null

# -- summary ---------------------------------------------------------------------------------------
step "summary"
"$PY" - "$OUT" <<'EOF' | tee "$OUT/summary.txt"
import json, os, re, sys
out = sys.argv[1]
print(f"machine: {os.cpu_count()} CPUs; " + next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                                                   if l.startswith("model name")), "?"))
path = os.path.join(out, "replication.log")
if os.path.exists(path):
    lines = open(path, errors="replace").read().splitlines()
    found = [json.loads(l) for l in lines if l.startswith('{"rows"')]
    data = {"rows": [r for d in found for r in d["rows"]], "kills": [k for d in found for k in d["kills"]]} if found else None
    print("\n## replication" + ("" if data else ": no result (see replication.log); its last lines:"))
    if data is None:
        print("\n".join(lines[-15:]))
    else:
        print(f"{'system':8} {'copies':32} {'batch':>5} {'msgs/s':>9} {'p50ms':>7} {'p99ms':>7} {'err':>4}  cpu l/f/etcd/cl")
        for r in data["rows"]:
            e = r["extra"]
            cpu = (f"{e['cpuLeader']:.2f}/{e['cpuFollowers']:.2f}/{e['cpuEtcd']:.2f}/{e['cpuClient']:.2f}"
                   if "cpuLeader" in e else "")
            print(f"{r['system']:8} {r['copies'][:32]:32} {r['batch']:>5} {r['msgs_s']:>9,.0f} {r['p50_ms']:>7.2f} "
                  f"{r['p99_ms']:>7.2f} {r['errors']:>4}  {cpu}")
        for r in data["rows"]:
            if "lagSamples" in r["extra"]:
                e = r["extra"]
                print(f"lag ({r['copies']}, batch {r['batch']}): p50 {e['lagBytesP50']:,.0f} B, p99 "
                      f"{e['lagBytesP99']:,.0f} B, max {e['lagBytesMax']:,.0f} B ({e['lagSamples']} samples)")
        by = {}
        for r in data["rows"]:
            by.setdefault((r["system"], r["batch"]), []).append(r)
        costs = [f"{s} b{b}: {100 * (1 - p[1]['msgs_s'] / p[0]['msgs_s']):.0f}%"
                 for (s, b), p in by.items() if len(p) == 2 and p[0]["msgs_s"]]
        print("3 copies cost: " + ", ".join(costs))
        if data["kills"]:
            k = data["kills"]
            print("failover kill->first ack s: " + ", ".join(f"{x['first_ack_s']:.2f}" for x in k) +
                  "; kill->all readable s: " + ", ".join(f"{x['all_readable_s']:.2f}" for x in k) +
                  "; max read gap s: " + ", ".join(f"{x['max_read_gap_s']:.2f}" for x in k))
    for l in lines:
        if "took" in l or "Traceback" in l or "Error" in l[:80] or "TIMEOUT" in l or ": exit" in l or "skipped" in l:
            print("  log: " + l[:200])
path = os.path.join(out, "gateway_scaling.log")
if os.path.exists(path):
    print("\n## gateway throughput against gateway processes (msgs/s; call p50/p99 ms; cores: gateway, server, ours)")
    workers, rows, notes = None, {}, []
    for l in open(path, errors="replace"):
        m = re.match(r"=== gateway-workers (\d+) ===", l)
        if m:
            workers = int(m.group(1))
        elif l.startswith('{"bench"'):
            d = json.loads(l)
            rows.setdefault(d["case"], {})[workers] = d["median"]
        elif "exit" in l and "gateway workers" in l or "TIMEOUT" in l or "Traceback" in l or "skipped" in l:
            notes.append(l.strip()[:200])
    ws = sorted({w for r in rows.values() for w in r})
    print(f"{'case':20}" + "".join(f"{'w=' + str(w):>34}" for w in ws))
    for case, r in rows.items():
        cells = []
        for w in ws:
            m = r.get(w)
            cells.append(f"{m['msgsPerSec']:>9,.0f} {m['callP50Us'] / 1000:>5.1f}/{m['callP99Us'] / 1000:<6.1f}"
                         f"{m.get('cpuGateway', float('nan')):>4.1f},{m.get('cpuServer', float('nan')):>4.1f},"
                         f"{m.get('cpuOurs', float('nan')):>4.1f}" if m else f"{'-':>34}")
        print(f"{case[:20]:20}" + "".join(f"{c:>34}" for c in cells))
    for n in notes:
        print("  " + n)
EOF
step "done in $(( $(date +%s) - START_EPOCH )) s; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
