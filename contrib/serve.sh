#!/usr/bin/env bash
# serve.sh — runs an already built tokentap in the foreground, with the
# bundled simulator as its upstream when no --upstream is given: the second
# half of run.sh, which installs what is missing and builds first. Every
# argument goes to tokentap unchanged.
#
# Signals to the script are tokentap's: SIGTERM and SIGINT (Ctrl-C) drain it
# once, SIGHUP reloads its configuration. tokentap and the simulator run in
# sessions of their own, so a terminal's Ctrl-C reaches only this script,
# which passes it on; the simulator is stopped after tokentap has finished,
# never before, so streams still draining keep their upstream. The script
# exits with tokentap's status.
#
#   TOKENTAP_BIN, TOKENTAP_SIM_BIN   the binaries (default: under build/)
#   TOKENTAP_SIM_LISTEN              the simulator's address (127.0.0.1:8000); the
#                                    script stops with a message if it is taken
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tokentap=${TOKENTAP_BIN:-$root/build/tokentap}
sim=${TOKENTAP_SIM_BIN:-$root/build/contrib/sim/tokentap-sim}

have_upstream=no
for a in "$@"; do
	case "$a" in
	-u | --upstream | --upstream=*) have_upstream=yes ;;
	esac
done

args=("$@")
sim_pid=
tt_pid=
# A signal before tokentap runs stops the script (and the simulator, below).
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP
stop_sim() {
	[ -n "$sim_pid" ] || return 0
	kill "$sim_pid" 2>/dev/null || true
	wait "$sim_pid" 2>/dev/null || true
}
trap stop_sim EXIT
# True when something accepts connections on $sim_listen (HOST:PORT or
# [V6]:PORT).
sim_port_open() {
	local host=${sim_listen%:*}
	host=${host#[}
	host=${host%]}
	(exec 3<>"/dev/tcp/$host/${sim_listen##*:}") 2>/dev/null
}
if [ "$have_upstream" = no ]; then
	sim_listen=${TOKENTAP_SIM_LISTEN:-127.0.0.1:8000}
	# tokentap must proxy to this simulator, not to whatever else holds the
	# port: the port must be free before, and ours must be listening after.
	if sim_port_open; then
		echo "serve.sh: $sim_listen is already in use; stop what listens there, or give the simulator another" \
			"address with TOKENTAP_SIM_LISTEN=HOST:PORT (or give tokentap --upstream URL)" >&2
		exit 1
	fi
	setsid "$sim" --listen "$sim_listen" &
	sim_pid=$!
	for ((i = 0; ; i++)); do
		if ! kill -0 "$sim_pid" 2>/dev/null; then
			sim_pid=
			echo "serve.sh: the simulator could not start on $sim_listen (see its message above)" >&2
			exit 1
		fi
		sim_port_open && break
		if [ "$i" -ge 100 ]; then
			echo "serve.sh: the simulator is not listening on $sim_listen after 5 s" >&2
			exit 1
		fi
		sleep 0.05
	done
	args=(--upstream "http://$sim_listen" --access-log - "${args[@]}")
	cat >&2 <<MSG
tokentap: no --upstream given; the simulator serves on $sim_listen.
Try, in another terminal:
  curl -N http://127.0.0.1:8080/v1/chat/completions -H 'content-type: application/json' \\
    -d '{"model":"sim-model","stream":true,"messages":[{"role":"user","content":"Hello"}]}'
MSG
fi
setsid "$tokentap" "${args[@]}" &
tt_pid=$!
trap 'kill -INT "$tt_pid" 2>/dev/null || true' INT
trap 'kill -TERM "$tt_pid" 2>/dev/null || true' TERM
trap 'kill -HUP "$tt_pid" 2>/dev/null || true' HUP
# A trapped signal ends `wait` early; wait again until tokentap has exited.
status=0
while :; do
	wait "$tt_pid" && status=0 || status=$?
	kill -0 "$tt_pid" 2>/dev/null || break
done
exit "$status"
