// Provenance of a result: what ran, built how, with which libraries, where.
#pragma once
#include <string>
#include <vector>

#include "shardbench/trace/h5.h"

namespace sb {

// Command line, versions of shardbench, compiler, MPI, HDF5 (and CUDA/NCCL where built),
// and rank 0's SLURM_* environment. Collective over MPI_COMM_WORLD.
std::vector<Attr> collect_provenance(const std::vector<std::string>& argv);

}  // namespace sb
