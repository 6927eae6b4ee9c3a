# Slurm sweeps (slurm/, runs/, docs/slurm.md).
#   make sweep-test   generator tests: matrix validation, names, dry run, skips, OOM records
#                     (tests/test_sweep.py; no Slurm needed)
#   make slurm-test   the runs/local.toml sweep on a real single-node Slurm cluster started
#                     on this machine (installs slurm-wlm and munge if missing; root)
.PHONY: sweep-test slurm-test
sweep-test: $(BIN)/ddp_perf $(BIN)/fsdp_perf
	$(PYTHON) tests/test_sweep.py

# collective_perf (the interconnect job's benchmark) when this tree has it
slurm-test: $(BIN)/ddp_perf $(BIN)/fsdp_perf $(if $(wildcard src/programs/collective_perf.cpp),$(BIN)/collective_perf)
	bash slurm/test/slurm-test.sh

EXTRA_TEST += sweep-test slurm-test
