# Sourced by jobs that run MPI across the emulated nodes (scripts/local-cluster.sh,
# scripts/local-slurm.sh): scripts/mpi-env.sh, then Open MPI's TCP on the bridge
# 198.18.0.0/24 instead of loopback, for messages (btl) and for mpirun's own wiring (oob:
# orted on another node calls mpirun back there). scripts/local-cluster.sh mpirun-args gives
# the same settings as flags.
# bash finds mpi-env.sh next to this file; sh (sbatch --wrap) from the checkout's root.
if [ -n "${BASH_VERSION:-}" ]; then
  eval '. "$(dirname "${BASH_SOURCE[0]}")/mpi-env.sh"'
else
  . scripts/mpi-env.sh
fi
export OMPI_MCA_btl_tcp_if_include=198.18.0.0/24 OMPI_MCA_oob_tcp_if_include=198.18.0.0/24
# Two connections: over one, traffic both ways at once (a ring's send-recv, all-reduce,
# all-gather) got half the shaped rate each way (16 MiB send-recv, 2 nodes at 200 Mbit/s:
# 96 Mbit/s a direction; with two 192, as one way alone).
export OMPI_MCA_btl_tcp_links=2
# SB_CLUSTER_EAGER=1: messages up to 4 MiB eager (no rendezvous), for the jobs that measure
# the links with exchanges both ways at once (the pair sweep, the 2-rank regression check):
# a pair exchanging both ways otherwise read 22 or 36 ms for 1 MiB at 400 Mbit/s by chance,
# the receiver's rendezvous reply queued behind its own outgoing message, so the two
# directions ran one after the other (docs/interconnect.md, "Diagnosis"). Training runs keep
# Open MPI's rendezvous, as on a cluster of its defaults: with the eager limit the hybrid runs
# of docs/projection.md (d) ran 3-5 % slower and their calibration 2-4 % faster, twice
# (-13.2/-16.8 % and -14.3/-16.3 % projected against measured; without it -7.2/-11.1 %).
if [ "${SB_CLUSTER_EAGER:-0}" = 1 ]; then
  export OMPI_MCA_btl_tcp_eager_limit=4194432 OMPI_MCA_btl_tcp_rndv_eager_limit=4194432
fi
# Rings for all-reduce and all-gather: for in-place buffers (DDP's buckets) Open MPI's
# non-blocking all-reduce takes a binomial tree, 0.003 GB/s busbw on 4 nodes x 2 at
# 100 Mbit/s, the ring 0.011 (DDP's step 5.49 s -> 1.54 s); its blocking defaults on 4
# nodes x 1, 8 MiB: all-reduce 0.008, all-gather 0.006, rings 0.011 (docs/projection.md,
# "Across emulated links"); the reduce-scatter's default reached 0.0106-0.0113, its ring too.
export OMPI_MCA_coll_libnbc_iallreduce_algorithm=1 OMPI_MCA_coll_tuned_use_dynamic_rules=1
export OMPI_MCA_coll_tuned_allreduce_algorithm=4 OMPI_MCA_coll_tuned_allgather_algorithm=4
export OMPI_MCA_coll_tuned_reduce_scatter_algorithm=3
