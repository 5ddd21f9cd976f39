#!/usr/bin/env bash
# Builds the real RocketMQ 4.9.8 DefaultMessageStore (store/ with the common/, logging/ and remoting/
# classes it reaches) from source with javac against Debian's jars, and RocketMQ498Ha, the driver the
# HA check runs (docs/replication.md, "A real RocketMQ 4.9.8").
#
# Source, first found: $ROCKETMQ_SRC (a checkout of 4.9.8), $ROCKETMQ_GIT_DIR (a git directory that
# has the tag), else the tag fetched (depth 1) from $ROCKETMQ_URL, by default GitHub. The tag must be
# the released commit.
# Output: build/rocketmq498/{classes,classpath}; a second run with unchanged inputs does nothing.
set -euo pipefail

TAG=rocketmq-all-4.9.8
COMMIT=2bdd53ef6694ffa19fd00db0b887e4895444f63e
MODULES="store common logging remoting"
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
OUT=${ROCKETMQ498_BUILD:-$ROOT/build/rocketmq498}
J=/usr/share/java
# What the store path needs from Debian (package: jars). fastjson and DLedger are not packaged: see stubs/.
PACKAGES="openjdk-17-jdk-headless libnetty-java libjna-java libcommons-lang3-java libcommons-validator-java
liblz4-java libzstd-jni-java libslf4j-java"
JARS="netty-buffer netty-common netty-transport netty-handler jna commons-lang3 commons-validator lz4-java
zstd-jni slf4j-api slf4j-simple"

missing=""
command -v javac >/dev/null 2>&1 || missing=1
for jar in $JARS; do [ -f "$J/$jar.jar" ] || missing=1; done
if [ -n "$missing" ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        $PACKAGES >/dev/null
fi
classpath=$(for jar in $JARS; do printf '%s:' "$J/$jar.jar"; done)

mkdir -p "$OUT"
src="$OUT/src"
if [ ! -f "$src/.commit" ] || [ "$(cat "$src/.commit")" != "$COMMIT" ]; then
    rm -rf "$src" && mkdir -p "$src"
    paths=$(for m in $MODULES; do printf '%s/src/main/java ' "$m"; done)
    if [ -n "${ROCKETMQ_SRC:-}" ]; then
        (cd "$ROCKETMQ_SRC" && tar cf - $paths) | tar xf - -C "$src"
        echo "RocketMQ source: $ROCKETMQ_SRC (taken as $TAG)"
    else
        git_dir=${ROCKETMQ_GIT_DIR:-}
        if [ -z "$git_dir" ]; then
            git_dir="$OUT/rocketmq.git"
            if ! git --git-dir="$git_dir" rev-parse --quiet --verify "$TAG^{commit}" >/dev/null 2>&1; then
                git init --quiet --bare "$git_dir"
                git --git-dir="$git_dir" fetch --quiet --depth 1 "${ROCKETMQ_URL:-https://github.com/apache/rocketmq.git}" \
                    "refs/tags/$TAG:refs/tags/$TAG"
            fi
        fi
        found=$(git --git-dir="$git_dir" rev-parse "$TAG^{commit}")
        [ "$found" = "$COMMIT" ] || { echo "$TAG is $found in $git_dir, not $COMMIT" >&2; exit 1; }
        git --git-dir="$git_dir" archive "$COMMIT" $paths | tar xf - -C "$src"
        echo "RocketMQ source: $git_dir at $TAG ($COMMIT)"
    fi
    # Replaced by stubs/ (DLedger mode, never enabled here): the real one needs the DLedger library.
    rm -f "$src/store/src/main/java/org/apache/rocketmq/store/dledger/DLedgerCommitLog.java"
    echo "$COMMIT" > "$src/.commit"
fi

stamp=$(cat "$HERE/RocketMQ498Ha.java" $(find "$HERE/stubs" -name '*.java' | sort) "$src/.commit" \
    | sha256sum | cut -c1-16)
if [ -f "$OUT/classes/.stamp" ] && [ "$(cat "$OUT/classes/.stamp")" = "$stamp" ]; then
    echo "build/rocketmq498: up to date"
    exit 0
fi
rm -rf "$OUT/classes" && mkdir -p "$OUT/classes"
sourcepath="$HERE/stubs"
for m in $MODULES; do sourcepath="$sourcepath:$src/$m/src/main/java"; done
start=$(date +%s)
# -sourcepath compiles only what RocketMQ498Ha reaches; stubs/ comes first, so it wins.
# javac's output (warnings on 4.9.8's use of sun.nio.ch.DirectBuffer) is shown only when it fails.
if ! javac -nowarn -encoding UTF-8 --add-exports java.base/sun.nio.ch=ALL-UNNAMED -d "$OUT/classes" \
    -cp "$classpath" -sourcepath "$sourcepath" "$HERE/RocketMQ498Ha.java" >"$OUT/javac.log" 2>&1; then
    cat "$OUT/javac.log" >&2
    exit 1
fi
echo "$OUT/classes:$classpath" > "$OUT/classpath"
echo "$stamp" > "$OUT/classes/.stamp"
echo "compiled $(find "$OUT/classes" -name '*.class' | wc -l) classes in $(( $(date +%s) - start )) s"
