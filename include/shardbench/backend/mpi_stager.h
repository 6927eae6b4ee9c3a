// The host side of the CUDA backend's collectives over MPI: each collective is divided into
// chunks (comm_staging.h) that pass three steps —
//   staged:    D2H copy of its inputs into a pinned host slot (device pointers: inputs ready)
//   in flight: the MPI call (non-blocking on host slots; blocking on device pointers, the only
//              kind Open MPI takes them in)
//   finished:  averages divided, H2D copy of the result, the slot handed back to the ring
// polled by progress(): MPI advances only when called, as on the CPU backend. Chunks are
// staged and started strictly in issue order, so every rank starts the same MPI operations
// in the same order whatever its timing. The slots form a ring reused once the H2D copy
// reading a slot has finished, so at most `slots` chunks are between D2H and H2D while the
// D2H of one chunk, the MPI call of another and the H2D of a third run at once.
//
// Point-to-point sends and receives (a pipeline's stages) stand outside that order: their two
// ranks issue them at different points of different schedules, and MPI matches them by peer
// and tag. Each is one non-blocking MPI call started as soon as it can be (a receive at
// issue, a send once its D2H has finished) through a pinned host buffer of its own, taken
// from a pool that grows to the messages in flight, never from the ring: a receive waiting
// for a peer never holds a slot that the peer's progress depends on. With device pointers
// they are MPI_Isend/MPI_Irecv on the buffers themselves, once the compute stream has
// reached the point of issue.
//
// Device work goes through StagingDevice (the CUDA backend's communication stream), so the
// whole pipeline also runs against host memory in tests/test_mpi_stager.cpp.
#pragma once
#include <mpi.h>

#include <cstddef>
#include <deque>
#include <vector>

#include "shardbench/backend/backend.h"
#include "shardbench/backend/comm_staging.h"
#include "shardbench/backend/mpi_ops.h"

namespace sb {

class StagingDevice {
 public:
  using Mark = void*;  // a point on the communication stream (a CUDA event), never null
  virtual ~StagingDevice() = default;
  // Enqueued on the communication stream in order, each timed as its own operation tagged
  // with the collective's phase and unit: `height` rows of `width` bytes (pitches in bytes).
  virtual void stage_copy(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                          Phase phase, int unit) = 0;
  virtual void comm_after(Mark compute_point) = 0;  // the stream waits for it (and releases it)
  virtual Mark comm_mark() = 0;                     // the stream's current end
  virtual bool mark_passed(Mark m) = 0;             // host query, no wait
  virtual void release_mark(Mark m) = 0;
  virtual void comm_sync() = 0;                     // host waits for the stream
  virtual char* host_alloc(size_t bytes) = 0;       // pinned host memory for the copies
  virtual void host_free(char* p) = 0;
  virtual double comm_clock() = 0;                  // the backend's clock
  // The collective's last copy is enqueued: `done` follows it (ownership passes), its MPI
  // calls took [start, end] on the host.
  virtual void collective_done(Request id, Mark done, OpKind kind, Phase phase, int unit, int64_t bytes,
                               double start, double end) = 0;
};

class MpiStager {
 public:
  // host_slots: config.total_bytes() of host memory (pinned for real copies), owned by the caller.
  MpiStager(StagingDevice& dev, CommLibrary lib, CudaAwareness awareness, const StagingConfig& config,
            char* host_slots);
  MpiStager(const MpiStager&) = delete;
  MpiStager& operator=(const MpiStager&) = delete;
  ~MpiStager();
  // Queues a collective on `comm` whose inputs are complete at `ready` (ownership passes).
  void issue(Request id, const CollectiveArgs& a, MPI_Comm comm, Phase phase, int unit, StagingDevice::Mark ready);
  bool pending(Request id) const;
  bool idle() const { return jobs_.empty() && p2p_.empty(); }
  void progress();
  void drain();  // every queued collective to collective_done()
  Transfer transfer_of(const CollectiveArgs& a, int ranks) const;

 private:
  struct Chunk_ {
    Chunk range;
    enum State { Waiting, Staged, InFlight, Finished } state = Waiting;
    int slot = -1;
    StagingDevice::Mark staged = nullptr;  // after its D2H
    MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  };
  struct Job {
    Request id;
    CollectiveArgs a;
    MPI_Comm comm;
    int size, rank;
    Transfer transfer;
    std::vector<Chunk_> chunks;
    size_t staged = 0, started = 0, finished = 0;
    StagingDevice::Mark ready = nullptr;
    Phase phase;
    int unit;
    double mpi_start = -1, mpi_end = 0;
  };
  struct PointToPoint {  // Send or Recv
    Request id;
    CollectiveArgs a;
    MPI_Comm comm;
    Transfer transfer;
    enum State { Waiting, Copying, InFlight } state = Waiting;
    int buffer = -1;                        // in buffers_ (staged)
    StagingDevice::Mark ready = nullptr;    // the compute stream at issue
    StagingDevice::Mark copied = nullptr;   // after a send's D2H
    MPI_Request req = MPI_REQUEST_NULL;
    Phase phase;
    int unit;
    double mpi_start = -1;
  };
  struct HostBuffer {
    char* ptr;
    size_t bytes;
    bool busy;
    StagingDevice::Mark free_after;  // the H2D copy that last read it
  };
  struct Slot {
    StagingDevice::Mark free_after = nullptr;  // the H2D copy that last read it
    bool busy = false;                         // between its D2H and its H2D
  };

  void stage_chunks();
  void start_chunks();
  void finish_chunks();
  void complete_jobs();
  void wait_ready(Job& j);
  void order_after(StagingDevice::Mark& m);  // the stream waits for m (once)
  char* slot_ptr(int slot) const { return host_ + int64_t(slot) * config_.slot_bytes; }
  void copy_in(const Job& j, const Chunk_& ch);
  void start_staged(Job& j, Chunk_& ch);
  void copy_out(const Job& j, const Chunk_& ch);
  void call_direct(Job& j, Chunk_& ch);
  void progress_point_to_point();
  bool advance(PointToPoint& p);  // true once the operation is done
  void start_point_to_point(PointToPoint& p, void* buf);
  int take_buffer(size_t bytes);

  StagingDevice& dev_;
  CommLibrary lib_;
  CudaAwareness awareness_;
  StagingConfig config_;
  char* host_;
  std::vector<Slot> slots_;
  size_t next_slot_ = 0;
  std::deque<Job> jobs_;  // in issue order
  std::deque<PointToPoint> p2p_;
  std::vector<HostBuffer> buffers_;
  MpiReductions reductions_;
  bool in_progress_ = false;
};

}  // namespace sb
