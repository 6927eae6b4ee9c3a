# Slurm sweeps (slurm/, runs/, docs/slurm.md).
#   make sweep-test   generator tests: matrix validation, names, dry run, skips, OOM records
#                     (tests/test_sweep.py; no Slurm needed)
#   make slurm-test   the runs/local.toml sweep on a real single-node Slurm cluster started
#                     on this machine (installs slurm-wlm and munge if missing; root)
#   make slurm-multinode-test
#                     a real 4-node Slurm over emulated nodes (scripts/local-slurm.sh): srun
#                     placement, the interconnect job against a shaped link, the
#                     runs/local-multinode.toml sweep with srun and mpirun; skipped (exit 77 of
#                     the script, not a failure) where network namespaces cannot be made or
#                     Slurm cannot be installed
.PHONY: sweep-test slurm-test slurm-multinode-test
sweep-test: $(BIN)/ddp_perf $(BIN)/fsdp_perf
	$(PYTHON) tests/test_sweep.py

# collective_perf (the interconnect job's benchmark) when this tree has it
slurm-test: $(BIN)/ddp_perf $(BIN)/fsdp_perf $(if $(wildcard src/programs/collective_perf.cpp),$(BIN)/collective_perf)
	bash slurm/test/slurm-test.sh

slurm-multinode-test: $(BIN)/ddp_perf $(BIN)/fsdp_perf $(BIN)/collective_perf
	@bash slurm/test/slurm-multinode-test.sh; rc=$$?; \
	if [ $$rc -eq 77 ]; then echo "slurm-multinode-test: counted as skipped, not passed"; exit 0; fi; exit $$rc

EXTRA_TEST += sweep-test slurm-test slurm-multinode-test
