// The parallel layout: replicate × shard = world, built once per run (layout_for in
// strategy.h) and handed to the plan, the mesh and the result; ParallelLayout::make is the
// one place a shard size is checked. The mesh splits the two communicators from it once. Shard group = consecutive ranks (a node); replicate
// group = the ranks with the same index in every shard group.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <memory>

#include "shardbench/backend/backend.h"

namespace sb {

struct ParallelLayout {
  int world = 1, rank = 0;
  int shard = 1;      // ranks sharing one copy of the model state (FSDP shard group)
  int replicate = 1;  // copies of the model state (data-parallel replicas of a shard group)

  // Throws UsageError unless 1 <= shard <= world and shard divides world.
  static ParallelLayout make(int world, int rank, int shard);
  ParallelLayout at_rank(int r) const;  // the same layout seen from rank r
  int shard_rank() const { return rank % shard; }
  int replicate_rank() const { return rank / shard; }
};

// One contiguous shard of a flat parameter padded to a multiple of the shard count.
struct ShardInfo {
  int64_t numel = 0;   // unpadded elements
  int64_t padded = 0;  // multiple of shards
  int64_t size = 0;    // elements per shard
  int64_t offset = 0;  // this shard's first element
};
ShardInfo shard_of(int64_t numel, int shards, int index);

// The layout plus its communicators. `real` meshes split MPI communicators; a planned mesh
// (for the memory plan of any world size) has communicators that never communicate.
struct Mesh {
  ParallelLayout layout;
  std::unique_ptr<Comm> shard_comm, replicate_comm;
  MPI_Comm shard_mpi = MPI_COMM_NULL, replicate_mpi = MPI_COMM_NULL;

  // `layout` must be `world`'s size and this process's rank in it.
  static Mesh split(Backend& b, MPI_Comm world, const ParallelLayout& layout);
  static Mesh planned(const ParallelLayout& layout);
  Mesh() = default;
  Mesh(Mesh&&) noexcept;
  Mesh& operator=(Mesh&&) noexcept;
  ~Mesh();
};

}  // namespace sb
