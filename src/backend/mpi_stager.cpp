#include "shardbench/backend/mpi_stager.h"

#include <algorithm>
#include <climits>
#include <iterator>

#include "shardbench/core/check.h"

namespace sb {

MpiStager::MpiStager(StagingDevice& dev, CommLibrary lib, CudaAwareness awareness, const StagingConfig& config,
                     char* host_slots)
    : dev_(dev), lib_(lib), awareness_(awareness), config_(config), host_(host_slots) {
  slots_.resize(size_t(config.slots));
}

MpiStager::~MpiStager() {
  for (Job& j : jobs_) {
    if (j.ready) dev_.release_mark(j.ready);
    for (Chunk_& ch : j.chunks)
      if (ch.staged) dev_.release_mark(ch.staged);
  }
  for (Slot& s : slots_)
    if (s.free_after) dev_.release_mark(s.free_after);
  for (PointToPoint& p : p2p_)
    for (StagingDevice::Mark m : {p.ready, p.copied})
      if (m) dev_.release_mark(m);
  for (HostBuffer& b : buffers_) {
    if (b.free_after) dev_.release_mark(b.free_after);
    dev_.host_free(b.ptr);
  }
}

Transfer MpiStager::transfer_of(const CollectiveArgs& a, int ranks) const {
  return choose_transfer(lib_, awareness_, a.op, a.dtype, a.redop, block_elements(a, ranks));
}

void MpiStager::issue(Request id, const CollectiveArgs& a, MPI_Comm comm, Phase phase, int unit,
                      StagingDevice::Mark ready) {
  if (collective_info(a.op).point_to_point) {
    SB_ASSERT(a.peer >= 0, "a send or receive without a peer");
    PointToPoint p{};
    p.id = id;
    p.a = a;
    p.comm = comm;
    p.transfer = transfer_of(a, 2);
    p.ready = ready;
    p.phase = phase;
    p.unit = unit;
    p2p_.push_back(p);
    progress();
    return;
  }
  Job j{};
  MPI_CHECK(MPI_Comm_size(comm, &j.size));
  MPI_CHECK(MPI_Comm_rank(comm, &j.rank));
  if (a.op == Collective::AllToAll)
    SB_ASSERT(a.count % j.size == 0 && a.send != a.recv, "all-to-all needs count divisible by ranks, out of place");
  if (a.op == Collective::SendRecv) SB_ASSERT(a.send != a.recv, "send-recv is out of place");
  j.id = id;
  j.a = a;
  j.comm = comm;
  j.transfer = transfer_of(a, j.size);
  const int64_t slot = j.transfer == Transfer::Staged ? config_.slot_bytes : INT64_MAX;
  for (const Chunk& k : plan_chunks(a.op, block_elements(a, j.size), j.size, dtype_size(a.dtype), slot)) {
    Chunk_ ch;
    ch.range = k;
    j.chunks.push_back(ch);
  }
  SB_ASSERT(j.transfer == Transfer::Staged || j.chunks.size() <= 1, "device pointers in more than one chunk");
  j.ready = ready;
  j.phase = phase;
  j.unit = unit;
  jobs_.push_back(std::move(j));
  progress();
}

bool MpiStager::pending(Request id) const {
  for (const Job& j : jobs_)
    if (j.id == id) return true;
  for (const PointToPoint& p : p2p_)
    if (p.id == id) return true;
  return false;
}

void MpiStager::progress() {
  if (idle() || in_progress_) return;
  in_progress_ = true;
  progress_point_to_point();
  stage_chunks();
  start_chunks();
  finish_chunks();
  complete_jobs();
  in_progress_ = false;
}

void MpiStager::drain() {
  while (!idle()) progress();
}

// The communication stream waits for the job's inputs (once).
void MpiStager::wait_ready(Job& j) { order_after(j.ready); }

void MpiStager::order_after(StagingDevice::Mark& m) {
  if (!m) return;
  dev_.comm_after(m);
  m = nullptr;
}

// D2H of the chunks whose turn it is, while the ring's next slot is free (in order).
void MpiStager::stage_chunks() {
  for (Job& j : jobs_) {
    while (j.staged < j.chunks.size()) {
      Chunk_& ch = j.chunks[j.staged];
      if (j.transfer == Transfer::Staged) {
        Slot& slot = slots_[next_slot_];
        if (slot.busy || (slot.free_after && !dev_.mark_passed(slot.free_after))) return;
        if (slot.free_after) dev_.release_mark(slot.free_after);
        slot.free_after = nullptr;
        wait_ready(j);
        slot.busy = true;
        ch.slot = int(next_slot_);
        next_slot_ = (next_slot_ + 1) % slots_.size();
        copy_in(j, ch);
        ch.staged = dev_.comm_mark();
      }
      ch.state = Chunk_::Staged;
      ++j.staged;
    }
  }
}

// MPI calls of staged chunks, strictly in order: a later chunk waits for an earlier one.
void MpiStager::start_chunks() {
  for (Job& j : jobs_) {
    while (j.started < j.staged) {
      Chunk_& ch = j.chunks[j.started];
      const bool staged = j.transfer == Transfer::Staged;
      if (staged) {
        if (!dev_.mark_passed(ch.staged)) return;
        dev_.release_mark(ch.staged);
        ch.staged = nullptr;
      } else {
        if (j.ready && !dev_.mark_passed(j.ready)) return;  // MPI reads the device buffers now
        wait_ready(j);
      }
      if (j.mpi_start < 0) j.mpi_start = dev_.comm_clock();
      staged ? start_staged(j, ch) : call_direct(j, ch);
      ch.state = Chunk_::InFlight;
      ++j.started;
    }
    if (j.started < j.chunks.size()) return;
  }
}

// Completed MPI calls: averages divided, H2D enqueued, the slot handed back to the ring.
void MpiStager::finish_chunks() {
  for (Job& j : jobs_)
    for (Chunk_& ch : j.chunks) {
      if (ch.state != Chunk_::InFlight) continue;
      int flag = 0;
      MPI_CHECK(MPI_Testall(2, ch.req, &flag, MPI_STATUSES_IGNORE));
      if (!flag) continue;
      j.mpi_end = dev_.comm_clock();
      if (j.transfer == Transfer::Staged) {
        copy_out(j, ch);
        Slot& slot = slots_[size_t(ch.slot)];
        slot.free_after = dev_.comm_mark();
        slot.busy = false;
      }
      ch.state = Chunk_::Finished;
      ++j.finished;
    }
}

// Jobs whose every chunk has finished: `done` after their last copy.
void MpiStager::complete_jobs() {
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    Job& j = *it;
    if (j.finished < j.chunks.size()) {
      ++it;
      continue;
    }
    wait_ready(j);  // an empty collective still orders after its inputs
    if (j.mpi_start < 0) j.mpi_start = j.mpi_end = dev_.comm_clock();
    dev_.collective_done(j.id, dev_.comm_mark(), collective_kind(j.a.op), j.phase, j.unit,
                         collective_bytes(j.a, j.size), j.mpi_start, j.mpi_end);
    it = jobs_.erase(it);
  }
}

// Sends and receives in any order among themselves and the collectives (each is done by
// its own MPI request); each advances as far as it can on every poll.
void MpiStager::progress_point_to_point() {
  for (auto it = p2p_.begin(); it != p2p_.end();) it = advance(*it) ? p2p_.erase(it) : std::next(it);
}

// Staged send: D2H into its buffer once the compute stream reaches the send, then MPI_Isend.
// Staged receive: MPI_Irecv at once, then H2D once the compute stream has reached the
// receive (the device buffer may be read until then). Device pointers: the MPI call once the
// compute stream has reached the point of issue.
bool MpiStager::advance(PointToPoint& p) {
  const bool send = p.a.op == Collective::Send;
  const size_t bytes = size_t(p.a.count) * size_t(dtype_size(p.a.dtype));
  if (p.state == PointToPoint::Waiting) {
    if (p.transfer == Transfer::DevicePointers) {
      if (p.ready && !dev_.mark_passed(p.ready)) return false;
      order_after(p.ready);
      start_point_to_point(p, send ? const_cast<void*>(p.a.send) : p.a.recv);
    } else if (send) {
      p.buffer = take_buffer(bytes);
      order_after(p.ready);
      dev_.stage_copy(buffers_[size_t(p.buffer)].ptr, bytes, p.a.send, bytes, bytes, 1, p.phase, p.unit);
      p.copied = dev_.comm_mark();
      p.state = PointToPoint::Copying;
    } else {
      p.buffer = take_buffer(bytes);
      start_point_to_point(p, buffers_[size_t(p.buffer)].ptr);
    }
  }
  if (p.state == PointToPoint::Copying) {
    if (!dev_.mark_passed(p.copied)) return false;
    dev_.release_mark(p.copied);
    p.copied = nullptr;
    start_point_to_point(p, buffers_[size_t(p.buffer)].ptr);
  }
  int flag = 0;
  MPI_CHECK(MPI_Test(&p.req, &flag, MPI_STATUS_IGNORE));
  if (!flag) return false;
  const double mpi_end = dev_.comm_clock();
  if (p.buffer >= 0) {
    HostBuffer& b = buffers_[size_t(p.buffer)];
    if (!send) {
      order_after(p.ready);
      dev_.stage_copy(p.a.recv, bytes, b.ptr, bytes, bytes, 1, p.phase, p.unit);
      b.free_after = dev_.comm_mark();
    }
    b.busy = false;
  }
  dev_.collective_done(p.id, dev_.comm_mark(), collective_kind(p.a.op), p.phase, p.unit, collective_bytes(p.a, 2),
                       p.mpi_start, mpi_end);
  return true;
}

void MpiStager::start_point_to_point(PointToPoint& p, void* buf) {
  const MPI_Datatype t = mpi_datatype(p.a.dtype);
  const int cnt = mpi_count(p.a.count);
  p.mpi_start = dev_.comm_clock();
  if (p.a.op == Collective::Send)
    MPI_CHECK(MPI_Isend(buf, cnt, t, p.a.peer, p.a.tag, p.comm, &p.req));
  else
    MPI_CHECK(MPI_Irecv(buf, cnt, t, p.a.peer, p.a.tag, p.comm, &p.req));
  p.state = PointToPoint::InFlight;
}

// A free pinned buffer of at least `bytes` (the smallest that fits), else a new one: the
// pool grows to the largest number of messages in flight at once and is reused every step.
int MpiStager::take_buffer(size_t bytes) {
  int best = -1;
  for (size_t i = 0; i < buffers_.size(); ++i) {
    HostBuffer& b = buffers_[i];
    if (b.busy || b.bytes < bytes) continue;
    if (b.free_after) {
      if (!dev_.mark_passed(b.free_after)) continue;
      dev_.release_mark(b.free_after);
      b.free_after = nullptr;
    }
    if (best < 0 || b.bytes < buffers_[size_t(best)].bytes) best = int(i);
  }
  if (best < 0) {
    buffers_.push_back({dev_.host_alloc(std::max<size_t>(bytes, 1)), std::max<size_t>(bytes, 1), false, nullptr});
    best = int(buffers_.size()) - 1;
  }
  buffers_[size_t(best)].busy = true;
  return best;
}

// Slot layouts (c = chunk elements, es = element size, n = ranks, row = c·es bytes):
//   all-reduce, reduce, broadcast: [row]; send-recv: [send row | recv row];
//   all-gather: n rows in rank order (in place); reduce-scatter: n rows, the result in the
//   first; all-to-all: [n send rows | n receive rows].
void MpiStager::copy_in(const Job& j, const Chunk_& ch) {
  const CollectiveArgs& a = j.a;
  const size_t es = size_t(dtype_size(a.dtype)), row = size_t(ch.range.count) * es;
  const char* src = static_cast<const char*>(a.send) + size_t(ch.range.first) * es;
  char* h = slot_ptr(ch.slot);
  const auto rows = [&](size_t src_pitch) { dev_.stage_copy(h, row, src, src_pitch, row, size_t(j.size), j.phase, j.unit); };
  switch (a.op) {
    case Collective::AllReduce:
    case Collective::Reduce:
    case Collective::SendRecv: dev_.stage_copy(h, row, src, row, row, 1, j.phase, j.unit); break;
    case Collective::Broadcast:
      if (j.rank == a.root) dev_.stage_copy(h, row, src, row, row, 1, j.phase, j.unit);
      break;
    case Collective::AllGather: dev_.stage_copy(h + size_t(j.rank) * row, row, src, row, row, 1, j.phase, j.unit); break;
    case Collective::ReduceScatter: rows(size_t(a.count) * es); break;
    case Collective::AllToAll: rows(size_t(a.count / j.size) * es); break;
    default: SB_FATAL("unknown collective");
  }
}

void MpiStager::start_staged(Job& j, Chunk_& ch) {
  const CollectiveArgs& a = j.a;
  const MPI_Datatype t = mpi_datatype(a.dtype);
  const MPI_Op op = reductions_.op(a.redop, a.dtype);
  const int cnt = mpi_count(ch.range.count), n = j.size, r = j.rank;
  char* h = slot_ptr(ch.slot);
  const size_t row = size_t(ch.range.count) * size_t(dtype_size(a.dtype));
  switch (a.op) {
    case Collective::AllReduce: MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, h, cnt, t, op, j.comm, &ch.req[0])); break;
    case Collective::AllGather:
      MPI_CHECK(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, h, cnt, t, j.comm, &ch.req[0]));
      break;
    case Collective::ReduceScatter:
      MPI_CHECK(MPI_Ireduce_scatter_block(MPI_IN_PLACE, h, cnt, t, op, j.comm, &ch.req[0]));
      break;
    case Collective::Broadcast: MPI_CHECK(MPI_Ibcast(h, cnt, t, a.root, j.comm, &ch.req[0])); break;
    case Collective::Reduce:
      MPI_CHECK(MPI_Ireduce(r == a.root ? MPI_IN_PLACE : h, r == a.root ? h : nullptr, cnt, t, op, a.root, j.comm,
                            &ch.req[0]));
      break;
    case Collective::AllToAll:
      MPI_CHECK(MPI_Ialltoall(h, cnt, t, h + size_t(n) * row, cnt, t, j.comm, &ch.req[0]));
      break;
    case Collective::SendRecv:  // send to rank+1, receive from rank−1
      MPI_CHECK(MPI_Irecv(h + row, cnt, t, (r - 1 + n) % n, 0, j.comm, &ch.req[1]));
      MPI_CHECK(MPI_Isend(h, cnt, t, (r + 1) % n, 0, j.comm, &ch.req[0]));
      break;
    default: SB_FATAL("unknown collective");
  }
}

void MpiStager::copy_out(const Job& j, const Chunk_& ch) {
  const CollectiveArgs& a = j.a;
  const size_t es = size_t(dtype_size(a.dtype)), row = size_t(ch.range.count) * es;
  char* dst = static_cast<char*>(a.recv) + size_t(ch.range.first) * es;
  char* h = slot_ptr(ch.slot);
  const bool root = j.rank == a.root;
  const bool reduced = a.op == Collective::AllReduce || a.op == Collective::ReduceScatter ||
                       (a.op == Collective::Reduce && root);
  if (reduced && a.redop == ReduceOp::Avg) divide_elements(h, ch.range.count, a.dtype, j.size);
  const auto one = [&](const char* src) { dev_.stage_copy(dst, row, src, row, row, 1, j.phase, j.unit); };
  switch (a.op) {
    case Collective::AllReduce:
    case Collective::ReduceScatter:
    case Collective::Broadcast: one(h); break;
    case Collective::Reduce:
      if (root) one(h);
      break;
    case Collective::SendRecv: one(h + row); break;
    case Collective::AllGather:
      dev_.stage_copy(dst, size_t(a.count) * es, h, row, row, size_t(j.size), j.phase, j.unit);
      break;
    case Collective::AllToAll:
      dev_.stage_copy(dst, size_t(a.count / j.size) * es, h + size_t(j.size) * row, row, row, size_t(j.size), j.phase,
                      j.unit);
      break;
    default: SB_FATAL("unknown collective");
  }
}

// Device pointers: the blocking collective, inputs ready. NCCL's in-place conventions map
// onto MPI_IN_PLACE; MPI leaves an in-place reduce-scatter's result at the start of the
// buffer, NCCL at this rank's slice: moved there on the communication stream.
void MpiStager::call_direct(Job& j, Chunk_& ch) {
  const CollectiveArgs& a = j.a;
  const MPI_Datatype t = mpi_datatype(a.dtype);
  const MPI_Op op = reductions_.op(a.redop, a.dtype);  // built-in: choose_transfer stages the rest
  const int cnt = mpi_count(ch.range.count), n = j.size, r = j.rank;
  const size_t es = size_t(dtype_size(a.dtype)), bytes = size_t(a.count) * es;
  auto* send = static_cast<char*>(const_cast<void*>(a.send));
  auto* recv = static_cast<char*>(a.recv);
  switch (a.op) {
    case Collective::AllReduce:
      MPI_CHECK(MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, cnt, t, op, j.comm));
      break;
    case Collective::AllGather:
      if (send == recv + r * bytes)
        MPI_CHECK(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, cnt, t, j.comm));
      else
        MPI_CHECK(MPI_Allgather(send, cnt, t, recv, cnt, t, j.comm));
      break;
    case Collective::ReduceScatter:
      if (recv == send + r * bytes) {
        MPI_CHECK(MPI_Reduce_scatter_block(MPI_IN_PLACE, send, cnt, t, op, j.comm));
        if (r != 0) dev_.stage_copy(recv, bytes, send, bytes, bytes, 1, j.phase, j.unit);
      } else {
        MPI_CHECK(MPI_Reduce_scatter_block(send, recv, cnt, t, op, j.comm));
      }
      break;
    case Collective::Broadcast:
      if (r == a.root && send != recv) {  // MPI broadcasts one buffer: the root's input goes there first
        dev_.stage_copy(recv, bytes, send, bytes, bytes, 1, j.phase, j.unit);
        dev_.comm_sync();
      }
      MPI_CHECK(MPI_Bcast(recv, cnt, t, a.root, j.comm));
      break;
    case Collective::Reduce:
      MPI_CHECK(MPI_Reduce(r == a.root && send == recv ? MPI_IN_PLACE : send, r == a.root ? recv : nullptr, cnt, t, op,
                           a.root, j.comm));
      break;
    case Collective::AllToAll: MPI_CHECK(MPI_Alltoall(send, cnt, t, recv, cnt, t, j.comm)); break;
    case Collective::SendRecv:
      MPI_CHECK(MPI_Sendrecv(send, cnt, t, (r + 1) % n, 0, recv, cnt, t, (r - 1 + n) % n, 0, j.comm,
                             MPI_STATUS_IGNORE));
      break;
    default: SB_FATAL("unknown collective");
  }
}

}  // namespace sb
