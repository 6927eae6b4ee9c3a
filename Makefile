# shardbench — plain Makefile. `make` builds everything this machine can build and says
# what it found; `make test` runs unit and MPI tests; `make demo` runs the small study.
SHELL := /bin/bash
.DEFAULT_GOAL := all

BUILD   ?= build
BIN     := $(BUILD)/bin
OBJ     := $(BUILD)/obj
PYTHON  ?= /usr/bin/python3
NP      ?= 4

# ---- what this machine has (llm.c-style: probe, say, fall back) ----
MPICXX    := $(shell command -v mpicxx 2>/dev/null)
CUDA_HOME ?= /usr/local/cuda
NVCC      := $(shell command -v $(CUDA_HOME)/bin/nvcc 2>/dev/null || command -v nvcc 2>/dev/null)
HAVE_CUBLAS := $(wildcard $(CUDA_HOME)/lib64/libcublas.so $(CUDA_HOME)/lib/libcublas.so)
HAVE_NCCL   := $(wildcard $(CUDA_HOME)/lib64/libnccl.so $(CUDA_HOME)/lib/libnccl.so /usr/lib/x86_64-linux-gnu/libnccl.so)

CXX       := $(if $(MPICXX),$(MPICXX),mpicxx)
# ---- target ISA: portable by default, so a build made on a login node runs on compute
# nodes with another CPU. x86-64-v3 (AVX2, FMA, F16C: Haswell/Zen and later) covers the
# vector code here; `make ARCH=native` tunes for this CPU only, `make ARCH=` leaves the
# compiler's default. Other hosts use the compiler's default unless ARCH is given.
ARCH      ?= $(if $(filter x86_64,$(shell uname -m)),x86-64-v3)
CXXFLAGS  ?= -O3 -g $(if $(ARCH),-march=$(ARCH))
CXXFLAGS  += -fno-math-errno -std=c++17 -Wall -Wextra -Wno-unused-parameter -Iinclude -I/usr/include/x86_64-linux-gnu -DOMPI_SKIP_MPICXX
HDF5_CFLAGS := $(shell pkg-config --cflags hdf5-openmpi 2>/dev/null)
HDF5_LIBS   := $(shell pkg-config --libs hdf5-openmpi 2>/dev/null)
# What the build cannot do without (scripts/install-deps.sh installs each). Make reads these
# probes once, when it parses this file: a target that installs packages and then builds
# must build in a second Make invocation (see demo and test below), or it builds with
# what the machine had before the install.
have_pc = $(shell pkg-config --exists $(1) 2>/dev/null && echo yes)
MISSING := $(strip $(if $(MPICXX),,Open_MPI) $(if $(HDF5_LIBS),,parallel_HDF5) \
             $(if $(wildcard /usr/include/x86_64-linux-gnu/cblas.h /usr/include/cblas.h),,OpenBLAS) \
             $(if $(call have_pc,CLI11),,CLI11) $(if $(call have_pc,gtest),,GoogleTest) \
             $(if $(call have_pc,benchmark),,Google_Benchmark))
comma := ,
space := $(subst ,, )
NEED_DEPS_MSG := shardbench: $(subst _, ,$(subst $(space),$(comma)$(space),$(MISSING))) not found; \
  run 'make deps' to install them, or 'make demo' / 'make test', which install what is missing first
VERSION   := $(shell git describe --always --dirty --tags 2>/dev/null || echo unknown)
CXXFLAGS  += $(HDF5_CFLAGS) -I$(BUILD)/gen
LDLIBS    := $(HDF5_LIBS) -lopenblas -lpthread
GTEST_LIBS:= -lgtest -lgtest_main -pthread

# The library's folders, bottom layer first (docs/architecture.md; tests/check_layers.py).
LIB_DIRS:= core backend model trace strategy run train bench
LIB_SRC := $(foreach d,$(LIB_DIRS),$(wildcard src/$(d)/*.cpp))
LIB_OBJ := $(patsubst src/%.cpp,$(OBJ)/%.o,$(LIB_SRC))
LIB     := $(BUILD)/libshardbench.a
# How programs link it (mk/cuda.mk: whole, its symbols exported to the CUDA plugin).
LIB_LINK = $(LIB)
PROGRAMS:= ddp_perf fsdp_perf collective_perf
TEST_SRC:= $(wildcard tests/test_*.cpp)
TESTS   := $(patsubst tests/%.cpp,$(BIN)/%,$(TEST_SRC))

# Optional parts plug in through mk/*.mk: each may add to these.
EXTRA_ALL  :=   # more targets built by `make`
EXTRA_TEST :=   # more targets run by `make test`, after the core tests
-include $(sort $(wildcard mk/*.mk))

.PHONY: all probe deps need-deps test unit-test mpi-test demo clean FORCE
all: probe $(addprefix $(BIN)/,$(PROGRAMS)) $(BIN)/kernel_bench $(TESTS) $(EXTRA_ALL)
# `make` on a machine without the packages: one line saying what to run, not a compiler error.
ifneq ($(MISSING),)
ifneq ($(filter all,$(or $(MAKECMDGOALS),all)),)
$(error $(NEED_DEPS_MSG))
endif
endif

# Every compile waits on this, so any target (install, one program) says the same line.
need-deps:
	@$(if $(MISSING),echo "$(NEED_DEPS_MSG)" >&2; exit 2,:)

probe:
	@echo "shardbench build:"
	@[ -n "$(MPICXX)" ] && echo "  ✓ MPI      $(MPICXX)" || echo "  ✗ MPI not found (run: make deps)"
	@[ -n "$(HDF5_LIBS)" ] && echo "  ✓ HDF5     parallel (hdf5-openmpi)" || echo "  ✗ parallel HDF5 not found (run: make deps)"
	@[ -n "$(NVCC)" ] && echo "  ✓ nvcc     $(NVCC)" || echo "  ✗ nvcc not found: CUDA backend not built"
	@[ -n "$(HAVE_CUBLAS)" ] && echo "  ✓ cuBLAS   $(firstword $(HAVE_CUBLAS))" || echo "  ✗ cuBLAS not found"
	@[ -n "$(HAVE_NCCL)" ] && echo "  ✓ NCCL     $(firstword $(HAVE_NCCL))" || echo "  ✗ NCCL not found"
	@echo "  · ISA      $(if $(ARCH),-march=$(ARCH),compiler default)$(if $(filter native,$(ARCH)), (this CPU only),; make ARCH=native for this CPU only)"
	@[ -n "$(HAVE_CUDA)" ] && echo "  · CUDA backend: built (fp32/TF32/bf16/fp16 cuBLAS + NCCL; see docs/gpu.md)" \
	  || echo "  · CUDA backend: not built (needs nvcc, cuBLAS and NCCL); CPU backend only"

deps:
	@bash scripts/install-deps.sh

# The host optimizer rounds every product and sum on its own (no FMA contraction), so its
# vectorised loops and their scalar remainders agree bit for bit (backend/host_optimizer.h).
$(OBJ)/backend/host_optimizer.o: CXXFLAGS += -ffp-contract=off
# and so does the scalar reference it is compared with bit for bit (tests/test_optimizer.cpp).
$(BIN)/test_optimizer: CXXFLAGS += -ffp-contract=off
$(OBJ)/%.o: src/%.cpp | need-deps
	@mkdir -p $(@D)
	$(CXX) $(CXXFLAGS) -MMD -MP -c $< -o $@

# The version (git describe) the provenance records; rewritten only when it changes.
$(BUILD)/gen/version.h: FORCE
	@mkdir -p $(@D)
	@echo '#define SB_VERSION "$(VERSION)"' > $@.new
	@cmp -s $@.new $@ && rm -f $@.new || mv $@.new $@
$(OBJ)/run/provenance.o: $(BUILD)/gen/version.h

# Made afresh: `ar r` into an old archive would keep members of moved or deleted sources.
$(LIB): $(LIB_OBJ)
	@mkdir -p $(@D)
	@rm -f $@
	ar rcs $@ $^

$(BIN)/%: src/programs/%.cpp $(LIB)
	@mkdir -p $(@D)
	@mkdir -p $(OBJ)/deps
	$(CXX) $(CXXFLAGS) -MMD -MP -MF $(OBJ)/deps/$(@F).d $< -o $@ $(LIB_LINK) $(LDLIBS)

$(BIN)/test_%: tests/test_%.cpp $(LIB)
	@mkdir -p $(@D)
	@mkdir -p $(OBJ)/deps
	$(CXX) $(CXXFLAGS) -MMD -MP -MF $(OBJ)/deps/$(@F).d $< -o $@ $(LIB_LINK) $(LDLIBS) $(GTEST_LIBS)

# Google Benchmark micro-benchmarks (not MPI).
$(BIN)/kernel_bench: src/programs/kernel_bench.cpp $(LIB)
	@mkdir -p $(@D) $(OBJ)/deps
	$(CXX) $(CXXFLAGS) -MMD -MP -MF $(OBJ)/deps/$(@F).d $< -o $@ $(LIB_LINK) $(LDLIBS) -lbenchmark -pthread

# The README's two commands work first on a fresh machine: install what is missing, then
# build in a new Make invocation whose probes see what was installed; in parallel on every
# core unless the user gave -j (a fresh build is most of a first `make demo`).
BUILD_JOBS = $(if $(filter -j%,$(MAKEFLAGS)),,-j$(shell nproc 2>/dev/null || echo 1))
test:
	@$(MAKE) --no-print-directory deps
	@$(MAKE) --no-print-directory $(BUILD_JOBS) all
	@bash tests/run_tests.sh
	@for t in $(EXTRA_TEST); do $(MAKE) --no-print-directory $$t || exit 1; done

demo:
	@$(MAKE) --no-print-directory deps
	@$(MAKE) --no-print-directory $(BUILD_JOBS) all
	@bash scripts/demo.sh
	@echo "timelines for Perfetto (ui.perfetto.dev) or chrome://tracing: $${OUT:-results/demo}/report/*.trace.json"

clean:
	rm -rf $(BUILD)

-include $(LIB_OBJ:.o=.d) $(wildcard $(OBJ)/deps/*.d)
