# Shared by the shell test suites: a temporary work directory, expect/ok/bad, a summary.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$ROOT/scripts/mpi-env.sh"
BIN=${BIN:-$ROOT/build/bin}
PY=/usr/bin/python3
pass=0 fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/work"
cd "$tmp/work"  # default result names (results/...) land here, not in the checkout

ok() { pass=$((pass + 1)); echo "ok    $1"; }
bad() { fail=$((fail + 1)); echo "FAIL  $1"; sed 's/^/      | /' "$tmp/out" | tail -n 25; }

# expect NAME CODE PATTERN -- command...: exit code CODE and PATTERN in stdout+stderr.
expect() {
  local name=$1 code=$2 pattern=$3
  shift 4
  "$@" >"$tmp/out" 2>&1
  local rc=$?
  if [ "$rc" -ne "$code" ]; then echo "      exit $rc, expected $code" >>"$tmp/out"; bad "$name"; return; fi
  if ! grep -qE -- "$pattern" "$tmp/out"; then echo "      missing /$pattern/" >>"$tmp/out"; bad "$name"; return; fi
  ok "$name"
}

# check NAME COMMAND...: passes when the command succeeds.
check() {
  local name=$1
  shift
  if "$@" >"$tmp/out" 2>&1; then ok "$name"; else bad "$name"; fi
}

summary() {
  echo "$pass passed, $fail failed"
  [ "$fail" -eq 0 ]
}
