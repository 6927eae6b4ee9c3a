#!/usr/bin/env bash
# Opens a report and a timeline in headless Chromium (Debian: apt-get install chromium) and
# keeps screenshots: the HTML report of REPORT_DIR (analysis/report.py's output), and the
# Perfetto JSON TRACE drawn by tests/browser/trace_viewer.html (no network needed). Checks
# that the browser parsed the whole trace: the viewer's slice count equals the JSON's.
#   tests/browser/check.sh REPORT_DIR TRACE.json OUT_DIR [STEP]
# Writes OUT_DIR/report.png and OUT_DIR/timeline.png; exit 1 when a check fails.
set -euo pipefail
REPORT=${1:?usage: check.sh REPORT_DIR TRACE.json OUT_DIR [STEP]}
TRACE=${2:?usage: check.sh REPORT_DIR TRACE.json OUT_DIR [STEP]}
OUT=${3:?usage: check.sh REPORT_DIR TRACE.json OUT_DIR [STEP]}
STEP=${4:-}
HERE=$(cd "$(dirname "$0")" && pwd)
command -v chromium >/dev/null || { echo "check.sh: chromium not found (apt-get install chromium)" >&2; exit 2; }
mkdir -p "$OUT"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
browse() {  # browse WIDTH,HEIGHT ARGS...: a fresh profile each time, nothing from the network
  local size=$1
  shift
  timeout 180 chromium --headless=new --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync --hide-scrollbars \
    --user-data-dir="$(mktemp -d -p "$work")" --allow-file-access-from-files --virtual-time-budget=30000 \
    --window-size="$size" "$@" 2>/dev/null
}
cp "$HERE/trace_viewer.html" "$TRACE" "$work/"
page="file://$work/trace_viewer.html?trace=$(basename "$TRACE")${STEP:+&step=$STEP}"
browse 1600,1300 --dump-dom "$page" >"$work/dom.html"
want=$(/usr/bin/python3 -c 'import json, sys; print(sum(e["ph"] == "X" for e in json.load(open(sys.argv[1]))["traceEvents"]))' "$TRACE")
got=$(sed -n 's/.*<div id="summary">[^<]*: \([0-9]*\) slices.*/\1/p' "$work/dom.html")
if [ "$got" != "$want" ]; then
  echo "FAIL  the browser drew ${got:-no} slices of $want: $(sed -n 's/.*<div id="summary">\([^<]*\)<.*/\1/p' "$work/dom.html")"
  exit 1
fi
echo "ok    Chromium parsed and drew $(basename "$TRACE"): $got slices"
browse 1600,920 --screenshot="$OUT/timeline.png" "$page" >/dev/null
browse 1400,2400 --screenshot="$OUT/report.png" "file://$(cd "$REPORT" && pwd)/index.html" >/dev/null
echo "ok    screenshots: $OUT/timeline.png, $OUT/report.png"
