#!/usr/bin/env bash
# run.sh — the one command to try tokentap: installs what is missing, builds,
# and runs tokentap in the foreground. Without --upstream it first starts the
# bundled simulator (tokentap-sim) on 127.0.0.1:8000 and proxies to it.
# Every other argument goes to tokentap unchanged. Ctrl-C stops both.
#
#   contrib/run.sh                                   # simulator as upstream
#   contrib/run.sh --upstream http://127.0.0.1:8000  # your server
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/contrib/setup.sh"
"$root/contrib/build.sh"

have_upstream=no
for a in "$@"; do
	case "$a" in
	-u | --upstream | --upstream=*) have_upstream=yes ;;
	esac
done

args=("$@")
sim_pid=
if [ "$have_upstream" = no ]; then
	sim_listen=${TOKENTAP_SIM_LISTEN:-127.0.0.1:8000}
	"$root/build/contrib/sim/tokentap-sim" --listen "$sim_listen" &
	sim_pid=$!
	trap 'kill "$sim_pid" 2>/dev/null || true' EXIT
	args=(--upstream "http://$sim_listen" --access-log - "${args[@]}")
	cat >&2 <<MSG
tokentap: no --upstream given; the simulator serves on $sim_listen.
Try, in another terminal:
  curl -N http://127.0.0.1:8080/v1/chat/completions -H 'content-type: application/json' \\
    -d '{"model":"sim-model","stream":true,"messages":[{"role":"user","content":"Hello"}]}'
MSG
fi
"$root/build/tokentap" "${args[@]}"
