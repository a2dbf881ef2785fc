#!/usr/bin/env bash
# Installs what jax_pathways' C++ builds against: grpc++ (the controller's
# gRPC frontend), libprotobuf and protoc (C++ classes of the IFRT-proxy
# messages, generated at build time) and pkg-config. Debian/Ubuntu (apt); a
# no-op when they are already there.
set -euo pipefail
if pkg-config --exists grpc++ protobuf 2>/dev/null && command -v protoc >/dev/null; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then
  if command -v sudo >/dev/null; then SUDO="sudo"; else
    echo "install_system_deps.sh: need root (or sudo) to apt-get install libgrpc++-dev libprotobuf-dev protobuf-compiler pkg-config" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends libgrpc++-dev \
  libprotobuf-dev protobuf-compiler pkg-config g++
