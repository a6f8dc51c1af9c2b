#!/bin/bash
# ab.sh — two tokentap builds side by side in one run, alternating round by
# round, in scenario (c) (CPU per forwarded event, events/s) or (b) (ttft and
# itl p99 under 256 streams), optionally with HAProxy in the same rounds as a
# yardstick. What proxies.py does for the peers, for an old and a new binary:
# a change is judged on rounds that shared the machine's mood.
#
#   contrib/bench/ab.sh [--build DIR] [--rounds N] [--scenario b|c] [--haproxy] OLD_BIN NEW_BIN
#
# Each tokentap runs with one loop and the store on, access log off, against
# the simulator on loopback. CPU comes from /proc (user + system, every
# thread). Prints one line per run; compare medians, not single rounds.
set -euo pipefail

build=build rounds=5 scenario=c haproxy=0 port=${AB_PORT_BASE:-18100}
while [ $# -gt 0 ]; do
	case $1 in
	--build) build=$2; shift 2 ;;
	--rounds) rounds=$2; shift 2 ;;
	--scenario) scenario=$2; shift 2 ;;
	--haproxy) haproxy=1; shift ;;
	-h|--help) sed -n '2,12p' "$0"; exit 0 ;;
	--*) echo "ab.sh: unknown option $1" >&2; exit 2 ;;
	*) break ;;
	esac
done
if [ $# -ne 2 ]; then
	echo "usage: ab.sh [--build DIR] [--rounds N] [--scenario b|c] [--haproxy] OLD_BIN NEW_BIN" >&2
	exit 2
fi
case $scenario in b|c) ;; *) echo "ab.sh: --scenario is b or c" >&2; exit 2 ;; esac
old=$(readlink -f "$1") new=$(readlink -f "$2")
sim_bin=$build/contrib/sim/tokentap-sim bench_bin=$build/contrib/bench/tokentap-bench
for b in "$old" "$new" "$sim_bin" "$bench_bin"; do
	[ -x "$b" ] || { echo "ab.sh: $b is not an executable" >&2; exit 2; }
done
[ $haproxy = 0 ] || command -v haproxy >/dev/null || [ -x /usr/sbin/haproxy ] ||
	{ echo "ab.sh: --haproxy needs Debian's haproxy package" >&2; exit 2; }

sim_port=$port proxy_port=$((port + 1)) admin_port=$((port + 2))
work=$(mktemp -d /tmp/tokentap-ab.XXXXXX)
sim_pid= proxy_pid=
cleanup() {
	[ -z "$proxy_pid" ] || kill "$proxy_pid" 2>/dev/null || true
	[ -z "$sim_pid" ] || kill "$sim_pid" 2>/dev/null || true
	wait 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT

printf 'access_log: off\nupstreams:\n  - name: sim\n    url: http://127.0.0.1:%d\n' "$sim_port" > "$work/tokentap.yaml"
cat > "$work/haproxy.cfg" <<EOF
global
    nbthread 1
    maxconn 4000
defaults
    mode http
    option http-no-delay
    http-reuse always
    timeout connect 5s
    timeout client 300s
    timeout server 300s
frontend fe
    bind 127.0.0.1:$proxy_port
    default_backend sim
backend sim
    server sim 127.0.0.1:$sim_port
EOF

if [ "$scenario" = c ]; then
	load=(--concurrency 64 --output-len 512 -H "x-sim-ttft-ms: 0" -H "x-sim-itl-ms: 0")
	warm=(--requests 200) measured=(--requests 3000)
else
	load=(--concurrency 256 --output-len 128 -H "x-sim-ttft-ms: 20" -H "x-sim-itl-ms: 20")
	warm=(--requests 256) measured=(--requests 768)
fi

"$sim_bin" --listen 127.0.0.1:$sim_port > "$work/sim.log" 2>&1 &
sim_pid=$!
sleep 0.5

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
bench() { timeout 300 "$bench_bin" --url http://127.0.0.1:$proxy_port --sim-headers --no-progress "${load[@]}" "$@" > /dev/null 2>&1; }

names=(old new)
[ $haproxy = 0 ] || names+=(haproxy)
for r in $(seq "$rounds"); do
	for name in "${names[@]}"; do
		case $name in
		old|new)
			bin=$old; [ $name = new ] && bin=$new
			rm -rf "$work/data"
			"$bin" -c "$work/tokentap.yaml" --listen 127.0.0.1:$proxy_port --admin 127.0.0.1:$admin_port \
				--data-dir "$work/data" --workers 1 > "$work/$name.log" 2>&1 &
			;;
		haproxy) haproxy -db -f "$work/haproxy.cfg" > "$work/haproxy.log" 2>&1 & ;;
		esac
		proxy_pid=$!
		sleep 0.4
		bench "${warm[@]}" --json /dev/null
		c0=$(cpu_ticks $proxy_pid)
		bench "${measured[@]}" --json "$work/run.json"
		c1=$(cpu_ticks $proxy_pid)
		kill $proxy_pid
		wait $proxy_pid 2>/dev/null || true
		proxy_pid=
		python3 - "$work/run.json" "$name" "$r" "$((c1 - c0))" "$(getconf CLK_TCK)" <<'EOF'
import json, sys
path, name, rnd, ticks, hz = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
r = json.load(open(path))["result"]
m, ev, t = r["metrics"], r["output_tokens"], r["throughput"]["elapsed_s"]
print("%-8s round %s  events/s %9.0f  cpu s/M events %.3f  ttft p50 %.3f p99 %.3f  itl p99 %.3f ms"
      % (name, rnd, ev / t, ticks / hz / ev * 1e6, m["ttft"]["p50_ms"], m["ttft"]["p99_ms"], m["itl"]["p99_ms"]))
EOF
	done
done
