#!/usr/bin/env bash
# Same plans, projections and --check figures from two builds: scripts/same_figures.py.
#   scripts/same-figures.sh OLD_BIN NEW_BIN [--quick] [--keep DIR]
source "$(dirname "$0")/mpi-env.sh"
exec /usr/bin/python3 "$(dirname "$0")/same_figures.py" "$@"
