# Sourced by jobs that run MPI across the emulated nodes (scripts/local-cluster.sh,
# scripts/local-slurm.sh): scripts/mpi-env.sh, then Open MPI's TCP on the bridge
# 198.18.0.0/24 instead of loopback, for messages (btl) and for mpirun's own wiring (oob:
# orted on another node calls mpirun back there), with two TCP connections per pair of ranks
# (one gave half the shaped rate each way when traffic runs both ways at once).
# bash finds mpi-env.sh next to this file; sh (sbatch --wrap) from the checkout's root.
if [ -n "${BASH_VERSION:-}" ]; then
  eval '. "$(dirname "${BASH_SOURCE[0]}")/mpi-env.sh"'
else
  . scripts/mpi-env.sh
fi
export OMPI_MCA_btl_tcp_if_include=198.18.0.0/24 OMPI_MCA_oob_tcp_if_include=198.18.0.0/24
export OMPI_MCA_btl_tcp_links=2
# Rings for all-reduce and all-gather (Open MPI's defaults reach a quarter to a half of the
# shaped links' rate across 4 nodes; scripts/local-cluster.sh mpirun_args says by how much).
export OMPI_MCA_coll_libnbc_iallreduce_algorithm=1 OMPI_MCA_coll_tuned_use_dynamic_rules=1
export OMPI_MCA_coll_tuned_allreduce_algorithm=4 OMPI_MCA_coll_tuned_allgather_algorithm=4
export OMPI_MCA_coll_tuned_reduce_scatter_algorithm=3
