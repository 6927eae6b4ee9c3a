#!/usr/bin/env bash
# The repo stands on its own: no citation of notes outside it (facts are cited from
# docs/references.md), no path of the machine a file was written on, no issue numbers.
# Usage: tests/check_self_contained.sh [ROOT]   (default: the checkout holding this script)
set -uo pipefail
root=${1:-"$(dirname "$0")/.."}
cd "$root" || exit 1

# Written so that this file does not match itself.
patterns=(
  'shared[/]'                                   # notes outside the repo (the shared folder)
  '(^|[^[:alnum:]_.$}~])/(work|root|home)[/]'   # absolute paths of a development machine
  '[Ii]ssues? #?[0-9]'                          # issue numbers (issue N, issue #N)
)
paths=(src include docs runs slurm analysis tests scripts mk Makefile README.md)

# The patterns must fire on what they are meant to catch, or this check cannot fail (the
# probes are spliced so that this file itself stays clean).
for probe in 'see ../sha''red/notes.md' 'cd /wo''rk/x' 'cd /ho''me/me/x' 'backend (iss''ue 3/6)'; do
  hit=0
  for p in "${patterns[@]}"; do grep -qE -- "$p" <<<"$probe" && hit=1; done
  [ "$hit" = 1 ] || { echo "check_self_contained: no pattern matches '$probe'"; exit 1; }
done

status=0
for p in "${patterns[@]}"; do
  if grep -rnIE --exclude-dir=__pycache__ -- "$p" "${paths[@]}"; then status=1; fi
done
if [ "$status" -ne 0 ]; then
  echo "check_self_contained: the lines above cite notes outside the repo, a machine path or an" \
       "issue number; cite docs/references.md (by section) and describe the change instead"
  exit 1
fi
echo "check_self_contained: ok (no outside notes, machine paths or issue numbers)"
