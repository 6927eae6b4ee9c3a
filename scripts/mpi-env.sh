# Sourced by the test and demo scripts: Open MPI settings for a single machine, as root,
# with more ranks than cores (see docs/performance.md for why each matters).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_mpi_yield_when_idle=1          # oversubscribed ranks must not busy-poll
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader,tcp OMPI_MCA_osc=^ucx
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_btl_tcp_if_include=lo
export PMIX_MCA_gds=hash HWLOC_HIDE_ERRORS=1
# hwloc's OpenGL plugin probes the X displays :0, :1, ... in every MPI_Init, each with a
# host-name lookup; where the name does not resolve locally (a fresh chroot has no
# /etc/hosts) each waits on DNS: 5.3 s per process start measured there, 0.27 s without it.
export HWLOC_COMPONENTS=${HWLOC_COMPONENTS:--gl}
# Open MPI 4.1's AVX reduction kernels saturate integer sums that overflow (uint8 sum of
# 251+5 gives 255, not 0; open-mpi/ompi#8045): collective_perf's data check caught it.
export OMPI_MCA_op=^avx
# Open MPI allocates a temporary buffer per large collective: keep it out of mmap/munmap.
export MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=1073741824 MALLOC_TOP_PAD_=268435456
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
