#!/bin/sh
# Generates the Python gRPC code of every .proto under proto/ into OUT (gen/ by default): the one recipe of
# `make setup` and the image build (deploy/Dockerfile). Each package's code lands at the path its name says
# (mqstore.v1 in gen/mqstore/v1, apache.rocketmq.v2 in gen/apache/rocketmq/v2, etcd.api.* in gen/etcd/api),
# so gen/ is a source root beside the repository root. `mqstore` stays a namespace package (no __init__.py):
# mqstore.client lives in the repository's mqstore/client/, mqstore.v1 here.
# Usage: proto/generate.sh PYTHON [OUT]   (PYTHON: an interpreter with grpcio-tools)
set -eu
python=${1:?usage: proto/generate.sh PYTHON [OUT]}
out=${2:-gen}
rm -rf "$out"
mkdir -p "$out"
# shellcheck disable=SC2046  # the .proto paths have no spaces
"$python" -m grpc_tools.protoc -Iproto --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" \
    $(find proto -name '*.proto' | sort)
find "$out" -mindepth 1 -type d ! -path "$out/mqstore" -exec touch {}/__init__.py \;
