#!/bin/sh
# Builds the two wheels (`make dist` and the image build share this recipe): mqstore-client (mqstore.client and
# the generated mqstore.v1; grpcio and protobuf only), staged from packaging/mqstore-client/pyproject.toml,
# then mqstore (the servers and their generated RocketMQ 5 and etcd code), which depends on it.
# Usage: packaging/build-wheels.sh PYTHON DIST   (run from the repository root after proto/generate.sh)
set -eu
python=${1:?usage: packaging/build-wheels.sh PYTHON DIST}
dist=${2:?usage: packaging/build-wheels.sh PYTHON DIST}
stage=${CLIENT_STAGE:-build/mqstore-client}
rm -rf "$stage" build/lib build/bdist.*
mkdir -p "$dist" "$stage/mqstore"
cp packaging/mqstore-client/pyproject.toml packaging/mqstore-client/README.md "$stage/"
cp -r mqstore/client gen/mqstore/v1 "$stage/mqstore/"
find "$stage" -name __pycache__ -prune -exec rm -rf {} +
"$python" -m pip wheel --quiet --disable-pip-version-check --no-deps --no-build-isolation -w "$dist" "$stage"
"$python" -m pip wheel --quiet --disable-pip-version-check --no-deps --no-build-isolation -w "$dist" .
