#!/usr/bin/env bash
# run.sh — the one command to try tokentap: installs what is missing, builds,
# and runs tokentap in the foreground. Without --upstream it first starts the
# bundled simulator (tokentap-sim) on 127.0.0.1:8000 and proxies to it.
# Every other argument goes to tokentap unchanged; contrib/serve.sh (which
# this ends in) says how signals reach it. Ctrl-C drains tokentap, then
# stops the simulator.
#
#   contrib/run.sh                                   # simulator as upstream
#   contrib/run.sh --upstream http://127.0.0.1:8000  # your server
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/contrib/setup.sh"
"$root/contrib/build.sh"

exec "$root/contrib/serve.sh" "$@"
