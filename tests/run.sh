#!/usr/bin/env bash
# run.sh — the one command that runs every test: installs what is missing,
# builds with warnings as errors into build-test/, and runs ctest (unit tests
# and the integration tests over real sockets).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/contrib/setup.sh"
cmake -S "$root" -B "$root/build-test" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTOKENTAP_WERROR=ON >/dev/null
cmake --build "$root/build-test" -j"$(nproc)"
cd "$root/build-test"
ctest --output-on-failure --timeout 300 "$@"
