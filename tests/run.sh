#!/usr/bin/env bash
# run.sh — the one command that runs every test (CI runs exactly this):
#
#   0. format:   every C source is as .clang-format says (contrib/format.sh
#                --check; seconds);
#   1. test:     builds with warnings as errors into build-test/ and runs
#                ctest: unit tests and the integration tests over real sockets;
#   2. sanitize: builds everything (proxy, simulator, llhttp, tests) with
#                AddressSanitizer + UndefinedBehaviorSanitizer, no recovery,
#                into build-asan/ and runs the same ctest suite there, leak
#                detection on, except the suites labelled `timing` (1 ms
#                agreement with an instrumented client binary: see
#                tests/integration/CMakeLists.txt); any report fails the run
#                (a unit test aborts; harness.py fails an integration test
#                whose tokentap or simulator printed a report);
#   3. fuzz:     builds the libFuzzer targets with clang into build-fuzz/ and
#                runs each for a short bounded time over its seed corpus
#                (ctest -L fuzz; TOKENTAP_FUZZ_TIME seconds each, default 10).
#
# Usage: tests/run.sh [--quick | --stages "format test sanitize fuzz"] [ctest args...]
#   --quick      only stage 1 (what a quick local check needs)
#   --stages S   the stages to run, in the order given above
# Extra arguments go to every stage's ctest (e.g. -R integration_hostile).
# TOKENTAP_TEST_STAGES in the environment is the same as --stages;
# TOKENTAP_BUILD_PREFIX (default <repo>/build) names the build directories
# <prefix>-test, <prefix>-asan and <prefix>-fuzz.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

stages=${TOKENTAP_TEST_STAGES:-"format test sanitize fuzz"}
prefix=${TOKENTAP_BUILD_PREFIX:-$root/build}
while [ $# -gt 0 ]; do
	case "$1" in
	--quick) stages="test"; shift ;;
	--stages) stages="$2"; shift 2 ;;
	--) shift; break ;;
	*) break ;;
	esac
done
for s in $stages; do
	case "$s" in
	format | test | sanitize | fuzz) ;;
	*) echo "run.sh: unknown stage '$s' (format, test, sanitize, fuzz)" >&2; exit 2 ;;
	esac
done
want() { case " $stages " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

"$root/contrib/setup.sh"
jobs=$(nproc)
fuzz_time=${TOKENTAP_FUZZ_TIME:-10}
summary=()
failed=0

# Each stage is one && chain: a failing stage is reported and the next one
# still runs, so one CI run shows every kind of failure; the exit status is
# non-zero when any stage failed.
run_stage() { # name, command...
	local name=$1 t0=$SECONDS rc=0
	shift
	"$@" || rc=$?
	if [ $rc -eq 0 ]; then
		summary+=("$(printf '%-9s passed %5ds' "$name" $((SECONDS - t0)))")
	else
		summary+=("$(printf '%-9s FAILED %5ds (status %d)' "$name" $((SECONDS - t0)) $rc)")
		failed=1
	fi
}

stage_format() {
	echo "== format: C sources against .clang-format" >&2
	"$root/contrib/format.sh" --check
}

stage_test() {
	echo "== test: $prefix-test/ (warnings are errors)" >&2
	cmake -S "$root" -B "$prefix-test" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTOKENTAP_WERROR=ON >/dev/null &&
		cmake --build "$prefix-test" -j"$jobs" &&
		(cd "$prefix-test" && ctest --output-on-failure --timeout 300 "$@")
}

stage_sanitize() {
	echo "== sanitize: $prefix-asan/ (ASan + UBSan, no recovery, leaks detected)" >&2
	# abort_on_error: a report kills the process at once, so the test sees
	# it; halt_on_error: UBSan stops at its first report, as ASan does.
	cmake -S "$root" -B "$prefix-asan" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTOKENTAP_WERROR=ON \
		-DTOKENTAP_SANITIZE=ON >/dev/null &&
		cmake --build "$prefix-asan" -j"$jobs" &&
		(cd "$prefix-asan" &&
			ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
				ctest --output-on-failure --timeout 300 -LE timing "$@")
}

stage_fuzz() {
	echo "== fuzz: $prefix-fuzz/ (clang, libFuzzer, $fuzz_time s per target)" >&2
	if ! command -v clang >/dev/null; then
		echo "run.sh: clang is needed for the fuzz stage (contrib/setup.sh installs it)" >&2
		return 1
	fi
	CC=clang cmake -S "$root" -B "$prefix-fuzz" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTOKENTAP_WERROR=ON \
		-DTOKENTAP_FUZZ=ON -DTOKENTAP_FUZZ_TIME="$fuzz_time" >/dev/null &&
		cmake --build "$prefix-fuzz" -j"$jobs" --target fuzz &&
		(cd "$prefix-fuzz" && ctest --output-on-failure -L fuzz -j"$jobs" "$@")
}

for s in format test sanitize fuzz; do
	if want "$s"; then
		if [ "$s" = format ]; then
			run_stage "$s" "stage_$s"
		else
			run_stage "$s" "stage_$s" "$@"
		fi
	fi
done

printf '%s\n' "run.sh:" "${summary[@]/#/  }" >&2
exit $failed
