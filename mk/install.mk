# Installing on a cluster (README "Installing"):
#   make install PREFIX=/opt/shardbench      programs in PREFIX/bin, the CUDA backend plugin (where
#                                            built) in PREFIX/lib; analysis, scripts, Slurm
#                                            files and run matrices in PREFIX/share/shardbench;
#                                            a modulefile in PREFIX/share/modulefiles/shardbench/
#   make uninstall PREFIX=/opt/shardbench    removes exactly what install put there
#   make install-test                        install into a temporary prefix and run from it
# DESTDIR is honoured for packaging (files go to DESTDIR/PREFIX, paths inside say PREFIX).
PREFIX     ?= /usr/local
SHARE_DIR  := $(PREFIX)/share/shardbench
MODULE_DIR := $(PREFIX)/share/modulefiles/shardbench
# The modulefile's name: the version without the leading v and any -dirty mark.
MODULE_VERSION := $(patsubst v%,%,$(subst -dirty,,$(VERSION)))
INSTALL_PROGRAMS = $(PROGRAMS) kernel_bench $(if $(HAVE_CUDA),gemm_peak)
SHARE_PARTS := analysis scripts slurm runs
# Tracked files only (no results, caches or test leftovers); every file outside a git checkout.
SHARE_FILES = $(or $(shell git ls-files $(SHARE_PARTS) 2>/dev/null),\
                   $(shell find $(SHARE_PARTS) -type f -not -path '*/__pycache__/*'))

.PHONY: install uninstall install-test
install: $(addprefix $(BIN)/,$(PROGRAMS)) $(BIN)/kernel_bench $(if $(HAVE_CUDA),$(BIN)/gemm_peak $(CUDA_PLUGIN))
	@case "$(PREFIX)" in /*) ;; *) echo "install: PREFIX '$(PREFIX)' is not allowed (an absolute path)" >&2; exit 2;; esac
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(SHARE_DIR) $(DESTDIR)$(MODULE_DIR)
	install -m 755 $(addprefix $(BIN)/,$(INSTALL_PROGRAMS)) $(DESTDIR)$(PREFIX)/bin/
	@# the programs load it from ../lib beside themselves (src/backend/cuda_plugin.cpp)
	$(if $(HAVE_CUDA),install -D -m 755 $(CUDA_PLUGIN) $(DESTDIR)$(PREFIX)/lib/$(notdir $(CUDA_PLUGIN)))
	cp --parents --preserve=mode -t $(DESTDIR)$(SHARE_DIR) $(SHARE_FILES)
	install -m 644 LICENSE README.md $(DESTDIR)$(SHARE_DIR)/
	@# slurm/sweep and slurm/interconnect.sbatch read this: run the installed programs.
	echo "$(PREFIX)" > $(DESTDIR)$(SHARE_DIR)/prefix
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(VERSION)|g' mk/modulefile.in \
	  > $(DESTDIR)$(MODULE_DIR)/$(MODULE_VERSION)
	@echo "installed shardbench $(VERSION) in $(DESTDIR)$(PREFIX)"
	@echo "  module use $(PREFIX)/share/modulefiles && module load shardbench/$(MODULE_VERSION)"

uninstall:
	@case "$(PREFIX)" in /*) ;; *) echo "uninstall: PREFIX '$(PREFIX)' is not allowed (an absolute path)" >&2; exit 2;; esac
	rm -f $(addprefix $(DESTDIR)$(PREFIX)/bin/,$(PROGRAMS) kernel_bench gemm_peak) \
	  $(DESTDIR)$(PREFIX)/lib/libshardbench_cuda.so
	rm -rf $(DESTDIR)$(SHARE_DIR) $(DESTDIR)$(MODULE_DIR)
	-rmdir $(DESTDIR)$(PREFIX)/share/modulefiles $(DESTDIR)$(PREFIX)/share $(DESTDIR)$(PREFIX)/bin \
	  $(DESTDIR)$(PREFIX)/lib 2>/dev/null
	@echo "removed shardbench from $(DESTDIR)$(PREFIX)"

install-test: $(addprefix $(BIN)/,$(PROGRAMS)) $(BIN)/kernel_bench $(if $(HAVE_CUDA),$(CUDA_PLUGIN))
	bash tests/install_test.sh

EXTRA_TEST += install-test
