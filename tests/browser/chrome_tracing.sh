#!/usr/bin/env bash
# Loads a Perfetto/Chrome trace JSON (analysis/to_perfetto.py) into the trace viewer that
# chrome://tracing serves, catapult's, in headless Chromium, checks that it imported every
# process, slice and counter track of the JSON with no warning, and keeps a screenshot.
#   tests/browser/chrome_tracing.sh CATAPULT_DIR TRACE.json OUT_DIR
# CATAPULT_DIR: a checkout of https://chromium.googlesource.com/catapult (or its GitHub
# mirror catapult-project/catapult); nothing of it is kept in this repository. Needs
# chromium (Debian package) and node/npm: puppeteer-core is installed into OUT_DIR/.node.
# Writes OUT_DIR/trace.html (trace2html's standalone viewer) and OUT_DIR/chrome_tracing.png.
set -euo pipefail
CATAPULT=${1:?usage: chrome_tracing.sh CATAPULT_DIR TRACE.json OUT_DIR}
TRACE=${2:?usage: chrome_tracing.sh CATAPULT_DIR TRACE.json OUT_DIR}
OUT=${3:?usage: chrome_tracing.sh CATAPULT_DIR TRACE.json OUT_DIR}
HERE=$(cd "$(dirname "$0")" && pwd)
[ -x "$CATAPULT/tracing/bin/trace2html" ] || { echo "chrome_tracing.sh: no tracing/bin/trace2html in '$CATAPULT'" >&2; exit 2; }
command -v chromium >/dev/null || { echo "chrome_tracing.sh: chromium not found (apt-get install chromium)" >&2; exit 2; }
command -v npm >/dev/null || { echo "chrome_tracing.sh: npm not found (apt-get install npm)" >&2; exit 2; }
mkdir -p "$OUT/.node"
OUT=$(cd "$OUT" && pwd)
/usr/bin/python3 "$CATAPULT/tracing/bin/trace2html" "$TRACE" --output "$OUT/trace.html" >/dev/null
[ -d "$OUT/.node/node_modules/puppeteer-core" ] ||
  (cd "$OUT/.node" && npm install --no-audit --no-fund --silent puppeteer-core@23 >/dev/null)
cp "$HERE/chrome_tracing.js" "$OUT/.node/"
got=$(node "$OUT/.node/chrome_tracing.js" "file://$OUT/trace.html" "$OUT/chrome_tracing.png")
/usr/bin/python3 - "$TRACE" "$got" <<'PY'
import json, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
got = json.loads(sys.argv[2])
m = got["model"]
want = {"processes": len({e["pid"] for e in events if e["ph"] in "XC"}),
        "slices": sum(e["ph"] == "X" for e in events),
        "counters": len({(e["pid"], e["name"]) for e in events if e["ph"] == "C"})}
if m is None:
    sys.exit(f"FAIL  the viewer built no model (page errors: {got['errors']})")
bad = [f"{k}: viewer {m[k]}, JSON {v}" for k, v in want.items() if m[k] != v]
if m["importWarnings"] or got["errors"]:
    bad.append(f"warnings {m['importWarnings'][:3]}, page errors {got['errors'][:3]}")
if bad:
    sys.exit("FAIL  " + "; ".join(bad))
print(f"ok    chrome://tracing's viewer imported {sys.argv[1]}: {m['processes']} processes, "
      f"{m['threads']} threads, {m['slices']} slices, {m['counters']} counter tracks, no warnings")
PY
echo "ok    screenshot: $OUT/chrome_tracing.png"
