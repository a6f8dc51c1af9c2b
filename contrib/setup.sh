#!/usr/bin/env bash
# setup.sh — installs the Debian 12 packages tokentap needs to build and test,
# skipping those already present. Safe to run again.
set -euo pipefail

packages=(
	build-essential cmake pkg-config
	libevent-dev libssl-dev node-llhttp liblmdb-dev libyaml-dev libjansson-dev
	zlib1g-dev libcmocka-dev
	# the protobuf exposition of /metrics (proto/metrics.proto)
	libprotobuf-c-dev protobuf-c-compiler
	python3 curl openssl
	# ip(8), for the network-fault tests (tests/integration/test_netfaults.py)
	iproute2
	clang libclang-rt-dev clang-format
	# the dashboard test (headless, runs without recommends) and the fleet-quantile test
	chromium fonts-dejavu-core prometheus
	# callgrind, for contrib/lab/instr.py and its test (tests/integration/test_instr.py)
	valgrind
	# system calls per request, for contrib/lab/syscalls.py and its test (tests/integration/test_lab.py)
	strace
)

missing=()
for p in "${packages[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# The SDK tests install the official openai npm package (tests/integration/
# test_responses.py). Any node with its npm will do: Debian's packages are
# installed only when neither command is there, since a node from elsewhere
# (one that bundles npm) conflicts with Debian's npm package.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
	missing+=(nodejs npm)
fi
if [ ${#missing[@]} -eq 0 ]; then
	exit 0
fi
echo "setup: installing ${missing[*]}" >&2
if [ "$(id -u)" -ne 0 ]; then
	SUDO=sudo
else
	SUDO=
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
