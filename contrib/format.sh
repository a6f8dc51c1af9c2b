#!/usr/bin/env bash
# format.sh — applies .clang-format to tokentap's C sources, or with --check
# reports (and fails on) every file that differs from it, as CI does.
#
# Usage: contrib/format.sh [--check]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
if ! command -v clang-format >/dev/null; then
	echo "format.sh: clang-format is needed (contrib/setup.sh installs it)" >&2
	exit 2
fi
mapfile -t files < <(git ls-files '*.c' '*.h')
if [ "${1:-}" = "--check" ]; then
	bad=0
	for f in "${files[@]}"; do
		if ! clang-format --dry-run --Werror "$f" >/dev/null 2>&1; then
			echo "format.sh: $f is not formatted as .clang-format says (run contrib/format.sh)" >&2
			bad=1
		fi
	done
	exit $bad
fi
clang-format -i "${files[@]}"
