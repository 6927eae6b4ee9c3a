# CUDA backend, included by the Makefile before its library rule.
# Built only when nvcc, cuBLAS and NCCL (headers and libraries) are all found; otherwise this
# adds nothing and the build stays CPU-only (`make probe` says which part is missing).
#   make CUDA_HOME=/opt/cuda          another toolkit
#   make CUDA_ARCHS="80 90 100"       compute capabilities to build kernels for (PTX of the
#                                     last one is embedded too, for newer GPUs)
# The build directory does not track flags: after changing CUDA_ARCHS, touch the .cu files.
CUDA_ARCHS ?= 80 90

# The first directory of a list that holds a file: $(call first_with,FILE,DIRS)
first_with = $(firstword $(foreach d,$(2),$(if $(wildcard $(d)/$(1)),$(d))))
CUDA_LIBDIR := $(call first_with,libcublas.so,$(CUDA_HOME)/lib64 $(CUDA_HOME)/lib)
CUDART_DIR  := $(call first_with,libcudart.so,$(CUDA_HOME)/lib64 $(CUDA_HOME)/lib)
CUBLAS_INC  := $(call first_with,cublas_v2.h,$(CUDA_HOME)/include)
NCCL_LIBDIR := $(call first_with,libnccl.so,$(CUDA_HOME)/lib64 $(CUDA_HOME)/lib /usr/lib/x86_64-linux-gnu)
NCCL_INC    := $(call first_with,nccl.h,$(CUDA_HOME)/include /usr/include)
HAVE_CUDA   := $(and $(NVCC),$(CUDA_LIBDIR),$(CUDART_DIR),$(CUBLAS_INC),$(NCCL_LIBDIR),$(NCCL_INC))

.PHONY: gpu-check
gpu-check:  # on a machine with a GPU: every part of scripts/gpu-check.sh, or PARTS="tests perf"
	@bash scripts/gpu-check.sh $(PARTS)

ifneq ($(HAVE_CUDA),)
CUDA_GENCODE := $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) \
                -gencode arch=compute_$(lastword $(CUDA_ARCHS)),code=compute_$(lastword $(CUDA_ARCHS))
NVCCFLAGS ?= -O3 -lineinfo
NVCCFLAGS += -std=c++17 -Iinclude -I$(NCCL_INC) $(shell $(CXX) --showme:compile 2>/dev/null) $(HDF5_CFLAGS) \
             -DOMPI_SKIP_MPICXX -DSB_HAVE_CUDA -DSB_CUDA_ARCHS='"$(CUDA_ARCHS)"' $(CUDA_GENCODE) \
             -Xcompiler=-Wall,-Wextra,-Wno-unused-parameter
# One rpath per library directory: the toolkit is not on the loader path of a typical host.
CUDA_LDLIBS := $(foreach d,$(sort $(CUDA_LIBDIR) $(CUDART_DIR) $(NCCL_LIBDIR)),-L$(d) -Wl,-rpath,$(d)) \
               -lcublasLt -lcublas -lnccl -lcudart

# The CUDA backend is a plugin (include/shardbench/backend/cuda_plugin.h): its objects and
# cuBLAS, NCCL and the CUDA runtime in a shared library the programs load at the first
# --backend cuda, so a CPU run, a plan or --help does not pay cuBLAS's 0.4 s load. The
# programs link the whole library and export its symbols, which the plugin calls back.
CUDA_SRC := $(wildcard src/backend/cuda/*.cu)
CUDA_OBJ := $(patsubst src/%.cu,$(OBJ)/%.o,$(CUDA_SRC))
CUDA_PLUGIN := $(BUILD)/lib/libshardbench_cuda.so
NVCCFLAGS += -Xcompiler=-fPIC
CXXFLAGS += -DSB_HAVE_CUDA -I$(CUBLAS_INC) -I$(NCCL_INC)
LIB_LINK  = -rdynamic -Wl,--whole-archive $(LIB) -Wl,--no-whole-archive
EXTRA_ALL += $(CUDA_PLUGIN) $(BIN)/test_cuda_backend $(BIN)/gemm_peak

$(CUDA_PLUGIN): $(CUDA_OBJ)
	@mkdir -p $(@D)
	$(CXX) -shared $^ -o $@ $(CUDA_LDLIBS) $(HDF5_LIBS)

$(OBJ)/backend/cuda/%.o: src/backend/cuda/%.cu | need-deps
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -MMD -MP -MF $(@:.o=.d) -c $< -o $@

$(OBJ)/gpu/%.o: tests/gpu/%.cu | need-deps
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -MMD -MP -MF $(@:.o=.d) -c $< -o $@

# Host code of the GPU tests (the SIMT emulation they compare the hardware with).
$(OBJ)/gpu/%.o: tests/gpu/%.cpp | need-deps
	@mkdir -p $(@D)
	$(CXX) $(CXXFLAGS) -MMD -MP -c $< -o $@

$(OBJ)/programs/%.o: src/programs/%.cu | need-deps
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -MMD -MP -MF $(@:.o=.d) -c $< -o $@

# Named test_* so tests/run_tests.sh runs it: it skips cleanly where no GPU is visible.
# Its own main() initialises MPI (NCCL communicators are made from MPI ones).
# It links the CUDA objects themselves (no plugin to load).
$(BIN)/test_cuda_backend: $(OBJ)/gpu/test_cuda_backend.o $(OBJ)/gpu/attention_emulation.o $(CUDA_OBJ) $(LIB)
	@mkdir -p $(@D)
	$(CXX) $(filter %.o,$^) -o $@ $(LIB) $(LDLIBS) $(CUDA_LDLIBS) -lgtest -pthread

$(BIN)/gemm_peak: $(OBJ)/programs/gemm_peak.o
	@mkdir -p $(@D)
	$(CXX) $< -o $@ $(CUDA_LDLIBS)

-include $(OBJ)/gpu/test_cuda_backend.d $(OBJ)/gpu/attention_emulation.d $(OBJ)/programs/gemm_peak.d
endif
