#include "shardbench/strategy/layout.h"

#include <string>

#include "shardbench/core/check.h"

namespace sb {

ParallelLayout ParallelLayout::make(int world, int rank, int shard) {
  if (shard < 1 || shard > world || world % shard != 0)
    throw UsageError("shard size " + std::to_string(shard) + " is not allowed with world size " +
                     std::to_string(world) + " (must divide it: replicate × shard = world)");
  ParallelLayout l;
  l.world = world;
  l.rank = rank;
  l.shard = shard;
  l.replicate = world / shard;
  return l;
}

ParallelLayout ParallelLayout::at_rank(int r) const {
  SB_ASSERT(r >= 0 && r < world, "rank outside the layout");
  ParallelLayout l = *this;
  l.rank = r;
  return l;
}

ShardInfo shard_of(int64_t numel, int shards, int index) {
  SB_ASSERT(shards >= 1 && index >= 0 && index < shards, "bad shard index");
  ShardInfo s;
  s.numel = numel;
  s.size = (numel + shards - 1) / shards;
  s.padded = s.size * shards;
  s.offset = s.size * index;
  return s;
}

Mesh Mesh::split(Backend& b, MPI_Comm world, const ParallelLayout& layout) {
  int size = 0, rank = 0;
  MPI_CHECK(MPI_Comm_size(world, &size));
  MPI_CHECK(MPI_Comm_rank(world, &rank));
  SB_ASSERT(layout.world == size && layout.rank == rank, "the layout is not this communicator's");
  Mesh m;
  m.layout = layout;
  MPI_CHECK(MPI_Comm_split(world, m.layout.replicate_rank(), m.layout.shard_rank(), &m.shard_mpi));
  MPI_CHECK(MPI_Comm_split(world, m.layout.shard_rank(), m.layout.replicate_rank(), &m.replicate_mpi));
  m.shard_comm = b.make_comm(m.shard_mpi);
  m.replicate_comm = b.make_comm(m.replicate_mpi);
  return m;
}

Mesh Mesh::planned(const ParallelLayout& l) {
  Mesh m;
  m.layout = l;
  m.shard_comm = make_planned_comm(l.shard, l.shard_rank());
  m.replicate_comm = make_planned_comm(l.replicate, l.replicate_rank());
  return m;
}

Mesh::Mesh(Mesh&& o) noexcept { *this = std::move(o); }
Mesh& Mesh::operator=(Mesh&& o) noexcept {
  layout = o.layout;
  shard_comm = std::move(o.shard_comm);
  replicate_comm = std::move(o.replicate_comm);
  std::swap(shard_mpi, o.shard_mpi);
  std::swap(replicate_mpi, o.replicate_mpi);
  return *this;
}
Mesh::~Mesh() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (shard_mpi != MPI_COMM_NULL) MPI_Comm_free(&shard_mpi);
  if (replicate_mpi != MPI_COMM_NULL) MPI_Comm_free(&replicate_mpi);
}

}  // namespace sb
