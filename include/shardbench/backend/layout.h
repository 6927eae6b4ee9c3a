// The parallel layout: world = pipeline stages × data-parallel replicas × shard group ×
// tensor-parallel group, built once per run (Setup::make in strategy/setup.h) and handed to the
// plan, the mesh, the model and the result. ParallelLayout::make is the one place the sizes
// are checked, and rank_at() the one place the rank order is defined: the tensor axis is
// innermost (consecutive ranks, inside a node first), then the shard axis, the replicate
// axis, and the pipeline stage outermost. Along an axis, a rank's group is the ranks that
// differ from it in that coordinate only. The mesh makes one communicator per axis.
#pragma once
#include <mpi.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardbench/backend/backend.h"

namespace sb {

struct ParallelLayout {
  int world = 1, rank = 0;
  int pp = 1;         // pipeline stages
  int replicate = 1;  // copies of the model state (data-parallel replicas of a shard group)
  int shard = 1;      // data-parallel ranks sharing one copy of the model state (FSDP shard group)
  int tp = 1;         // tensor-parallel ranks partitioning each layer (Megatron-LM)

  // Throws UsageError naming the flag as typed (--tp, then --pp, then --shard-size) unless
  // every size is >= 1, tp divides world, pp × tp divides world and shard divides the
  // data-parallel ranks world / (pp × tp) (replicate = world / (pp × shard × tp)).
  static ParallelLayout make(int world, int rank, int shard, int tp = 1, int pp = 1);
  ParallelLayout at_rank(int r) const;  // the same layout seen from rank r

  int size(Axis a) const;
  int coord(Axis a) const;  // this rank's index along `a`
  // THE rank order: the rank with these coordinates (indexed by Axis).
  int rank_at(const std::array<int, kAxes>& coords) const;
  std::array<int, kAxes> coords() const;
  // The ranks of this rank's group along `a`, in coordinate order (its own among them).
  std::vector<int> group(Axis a) const;
  // Which group along `a` this rank belongs to: 0 .. world/size(a)-1 (an MPI_Comm_split color).
  int group_index(Axis a) const;

  int dp() const { return replicate * shard; }  // the data-parallel degree
  // This rank's index among the data-parallel ranks: which slice of the global batch it takes.
  int dp_rank() const { return coord(Axis::Replicate) * shard + coord(Axis::Shard); }
  int shard_rank() const { return coord(Axis::Shard); }
  int replicate_rank() const { return coord(Axis::Replicate); }
  int tp_rank() const { return coord(Axis::Tensor); }
  int pp_rank() const { return coord(Axis::Pipeline); }
  std::string describe() const;  // "pp 1 × dp 2 (replicate 1 × shard 2) × tp 2"
};

// One contiguous shard of a flat parameter padded to a multiple of the shard count (and each
// shard to a multiple of `shard_multiple` elements: adamw-8bit's blocks, so a shard's blocks
// are the whole unit's).
struct ShardInfo {
  int64_t numel = 0;   // unpadded elements
  int64_t padded = 0;  // multiple of shards
  int64_t size = 0;    // elements per shard
  int64_t offset = 0;  // this shard's first element
};
ShardInfo shard_of(int64_t numel, int shards, int index, int64_t shard_multiple = 1);

// The layout plus one communicator per axis, looked up by axis. A mesh from_world() has MPI
// communicators (one MPI_Comm_split per axis); a planned mesh (for the memory plan of any
// world size) has communicators that never communicate. Each communicator knows its axis,
// so every collective on it is recorded with the axis it ran on.
struct Mesh {
  ParallelLayout layout;

  Comm& comm(Axis a) const;
  MPI_Comm mpi(Axis a) const { return mpi_[size_t(a)]; }  // MPI_COMM_NULL when planned
  MPI_Comm world() const { return world_; }                // what it was split from (not owned)

  // `layout` must be `world`'s size and this process's rank in it.
  static Mesh from_world(Backend& b, MPI_Comm world, const ParallelLayout& layout);
  static Mesh planned(const ParallelLayout& layout);
  Mesh() = default;
  Mesh(Mesh&&) noexcept;
  Mesh& operator=(Mesh&&) noexcept;
  ~Mesh();

 private:
  std::array<std::unique_ptr<Comm>, kAxes> comms_;
  std::array<MPI_Comm, kAxes> mpi_{MPI_COMM_NULL, MPI_COMM_NULL, MPI_COMM_NULL, MPI_COMM_NULL};
  MPI_Comm world_ = MPI_COMM_NULL;
};

}  // namespace sb
