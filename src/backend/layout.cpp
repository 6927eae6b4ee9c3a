#include "shardbench/backend/layout.h"

#include <string>

#include "shardbench/core/check.h"

namespace sb {

ParallelLayout ParallelLayout::make(int world, int rank, int shard, int tp, int pp) {
  const std::pair<const char*, int> sizes[] = {{"--tp", tp}, {"--pp", pp}};
  for (const auto& [name, v] : sizes)
    if (v < 1) throw UsageError(std::string(name) + " " + std::to_string(v) + " is not allowed (must be >= 1)");
  // The innermost axis first, so that each message names the flag that does not fit.
  if (world % tp != 0)
    throw UsageError("--tp " + std::to_string(tp) + " is not allowed with world size " + std::to_string(world) +
                     " (must divide it: dp x tp = world)");
  if (world % pp != 0 || (world / pp) % tp != 0)
    throw UsageError("--pp " + std::to_string(pp) + " is not allowed with world size " + std::to_string(world) +
                     (tp > 1 ? " and --tp " + std::to_string(tp) : std::string()) +
                     " (must divide it: pp x dp x tp = world)");
  const int64_t inner = int64_t(pp) * tp;
  const int dp = int(world / inner);
  if (shard < 1 || shard > dp || dp % shard != 0)
    throw UsageError("--shard-size " + std::to_string(shard) + " is not allowed with world size " + std::to_string(world) +
                     (inner > 1 ? " and " + std::to_string(dp) + " data-parallel ranks" : std::string()) +
                     " (must divide " + (inner > 1 ? "them" : "it") + ": replicate × shard = " +
                     (inner > 1 ? "world / (tp × pp)" : "world") + ")");
  ParallelLayout l;
  l.world = world;
  l.rank = rank;
  l.pp = pp;
  l.tp = tp;
  l.shard = shard;
  l.replicate = dp / shard;
  return l;
}

ParallelLayout ParallelLayout::at_rank(int r) const {
  SB_ASSERT(r >= 0 && r < world, "rank outside the layout");
  ParallelLayout l = *this;
  l.rank = r;
  return l;
}

int ParallelLayout::size(Axis a) const {
  switch (a) {
    case Axis::Pipeline: return pp;
    case Axis::Replicate: return replicate;
    case Axis::Shard: return shard;
    case Axis::Tensor: return tp;
    default: SB_FATAL("no such axis");
  }
}

// Mixed radix, the first axis (the pipeline) outermost and the last (tensor) innermost.
int ParallelLayout::rank_at(const std::array<int, kAxes>& c) const {
  int r = 0;
  for (int a = 0; a < kAxes; ++a) r = r * size(Axis(a)) + c[size_t(a)];
  return r;
}

std::array<int, kAxes> ParallelLayout::coords() const {
  std::array<int, kAxes> c{};
  int r = rank;
  for (int a = kAxes - 1; a >= 0; --a) {
    c[size_t(a)] = r % size(Axis(a));
    r /= size(Axis(a));
  }
  return c;
}

int ParallelLayout::coord(Axis a) const { return coords()[size_t(a)]; }

std::vector<int> ParallelLayout::group(Axis a) const {
  std::array<int, kAxes> c = coords();
  std::vector<int> ranks;
  for (int i = 0; i < size(a); ++i) {
    c[size_t(a)] = i;
    ranks.push_back(rank_at(c));
  }
  return ranks;
}

int ParallelLayout::group_index(Axis a) const {
  std::array<int, kAxes> c = coords();
  int g = 0;
  for (int i = 0; i < kAxes; ++i)
    if (i != int(a)) g = g * size(Axis(i)) + c[size_t(i)];
  return g;
}

std::string ParallelLayout::describe() const {
  return "pp " + std::to_string(pp) + " x dp " + std::to_string(dp()) + " (replicate " + std::to_string(replicate) +
         " x shard " + std::to_string(shard) + ") x tp " + std::to_string(tp);
}

ShardInfo shard_of(int64_t numel, int shards, int index, int64_t shard_multiple) {
  SB_ASSERT(shards >= 1 && index >= 0 && index < shards && shard_multiple >= 1, "bad shard index");
  ShardInfo s;
  s.numel = numel;
  s.size = ((numel + shards - 1) / shards + shard_multiple - 1) / shard_multiple * shard_multiple;
  s.padded = s.size * shards;
  s.offset = s.size * index;
  return s;
}

Comm& Mesh::comm(Axis a) const {
  SB_ASSERT(comms_[size_t(a)], std::string("the mesh has no ") + axis_name(a) + " communicator");
  return *comms_[size_t(a)];
}

Mesh Mesh::from_world(Backend& b, MPI_Comm world, const ParallelLayout& layout) {
  int size = 0, rank = 0;
  MPI_CHECK(MPI_Comm_size(world, &size));
  MPI_CHECK(MPI_Comm_rank(world, &rank));
  SB_ASSERT(layout.world == size && layout.rank == rank, "the layout is not this communicator's");
  Mesh m;
  m.layout = layout;
  m.world_ = world;
  for (int a = 0; a < kAxes; ++a) {
    const Axis axis = Axis(a);
    MPI_Comm& c = m.mpi_[size_t(a)];
    MPI_CHECK(MPI_Comm_split(world, layout.group_index(axis), layout.coord(axis), &c));
    m.comms_[size_t(a)] = b.make_comm(c);
    m.comms_[size_t(a)]->set_axis(axis);
  }
  return m;
}

Mesh Mesh::planned(const ParallelLayout& l) {
  Mesh m;
  m.layout = l;
  for (int a = 0; a < kAxes; ++a) {
    m.comms_[size_t(a)] = make_planned_comm(l.size(Axis(a)), l.coord(Axis(a)));
    m.comms_[size_t(a)]->set_axis(Axis(a));
  }
  return m;
}

Mesh::Mesh(Mesh&& o) noexcept { *this = std::move(o); }
Mesh& Mesh::operator=(Mesh&& o) noexcept {
  layout = o.layout;
  comms_ = std::move(o.comms_);
  std::swap(mpi_, o.mpi_);
  world_ = o.world_;
  return *this;
}
Mesh::~Mesh() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  for (MPI_Comm& c : mpi_)
    if (c != MPI_COMM_NULL) MPI_Comm_free(&c);
}

}  // namespace sb
