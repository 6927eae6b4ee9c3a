// Trace: receives the backend's operations and memory changes, keeps them per step, turns
// them into per-step figures (compute, communication, exposed communication, GEMM rate),
// and writes everything to HDF5 (docs/trace-format.md).
#pragma once
#include <mpi.h>

#include <string>
#include <vector>

#include "shardbench/backend/backend.h"
#include "shardbench/backend/layout.h"
#include "shardbench/trace/h5.h"

namespace sb {

// The version of the training programs' result format (docs/trace-format.md), written as
// `schema_version` into every result and every record of a failed run.
// 5: the host ledger (CPU offload): /host_memory, /host_memory_peaks, the plan's host_*
// attributes, the offload lanes (kHostLane, kCopyH2DLane, kCopyD2HLane) in /events;
// 4: the events' units are the split root's (embedding, blocks, bridge, head), named by
// unit_names; 3: events' axis and peer, the /mesh table
constexpr int kSchemaVersion = 5;

struct StepStats {
  int step = 0;
  double start = 0, end = 0;       // seconds since the run's common origin
  double compute = 0;              // compute-lane operations, waits excluded
  double gemm = 0;                 // of which GEMMs
  double gemm_flops = 0;           // FLOPs of those GEMMs
  double communication = 0;        // collectives, issue to observed completion, all lanes
  double exposed_comm = 0;         // compute lane in wait() or driving MPI progress
  double offload_copy = 0;         // copy_async copies (both copy lanes, may overlap)
  double host_compute = 0;         // host_compute's functions (kHostLane), their waits excluded
  int64_t comm_bytes = 0;          // collectives' buffers (nccl-tests' size)
  int64_t sent_bytes = 0;          // bytes this rank sent (bytes_sent())
  double loss = 0;                 // this rank's mean token loss
  int64_t peak_memory = 0;         // backend-accounted, all categories, since the start
  double time() const { return end - start; }
  // Time not spent in a compute operation or waiting for communication: the harness's own.
  double overhead() const { return time() - compute - exposed_comm; }
};

struct TraceEvent {
  int step;  // 0: set-up before the first step
  OpEvent op;
};

struct MemorySample {
  int step;
  double time;
  MemBytes bytes;
};

class TraceRecorder : public Recorder {
 public:
  // Times are stored relative to `origin` (the backend clock after a barrier), so ranks'
  // timelines line up to within the barrier's skew.
  explicit TraceRecorder(double origin = 0.0) : origin_(origin) {}
  void begin_step(int step, double t);
  StepStats end_step(double t, int64_t peak_memory);
  void on_op(const OpEvent& e) override;
  void on_memory(double t, const MemBytes& current) override;
  void on_host_memory(double t, const MemBytes& current) override;
  void set_keep_events(bool keep) { keep_ = keep; }

  const std::vector<TraceEvent>& events() const { return events_; }
  const std::vector<MemorySample>& memory() const { return memory_; }
  const std::vector<MemorySample>& host_memory() const { return host_memory_; }
  std::vector<OpEvent> step_events(int step) const;

 private:
  double origin_;
  bool keep_ = true;
  StepStats cur_;
  std::vector<TraceEvent> events_;
  std::vector<MemorySample> memory_;
  std::vector<MemorySample> host_memory_;
};

// This rank's figures of one step, as written to /steps.
struct StepRow {
  int32_t rank, step, warmup;
  double time, compute, communication, exposed_comm, overhead, gemm_time, gemm_flops;
  double model_tflops, hardware_tflops, tokens_per_s, loss;
  int64_t comm_bytes, peak_memory;
  int64_t device_used;  // Backend::device_memory_used() at the end of the step
  double loss_scale;    // the loss scale this step ran with
  int32_t skipped;      // 1: dynamic loss scaling skipped the update (inf/NaN gradients)
  int64_t sent_bytes;   // bytes this rank's collectives sent (bytes_sent())
  double idle;          // time - compute: waiting (a pipeline stage for its neighbours) or the harness
};

// Everything one rank contributes to the result file.
struct TraceData {
  std::vector<Attr> run;         // root attributes (identical on every rank)
  std::vector<Attr> provenance;  // /provenance attributes (identical on every rank)
  std::vector<Attr> plan;        // /plan attributes (identical on every rank)
  std::vector<std::string> unit_names;  // what the events' unit codes name (identical on every rank)
  std::string host, device;      // this rank's
  ParallelLayout layout;         // seen from this rank: its coordinates go to /mesh
  std::vector<StepRow> steps;
  const std::vector<TraceEvent>* events = nullptr;
  const std::vector<MemorySample>* memory = nullptr;
  const std::vector<MemorySample>* host_memory = nullptr;  // the host ledger's changes
  MemBytes peak{};               // this rank's accounted peaks per category
  int64_t peak_total = 0;
  MemBytes host_peak{};          // the same of the host ledger (alloc_host)
  int64_t host_peak_total = 0;
};

// Writes `data` of every rank of `comm` into `path` (docs/trace-format.md); see ResultFile
// for what happens when `path` exists.
void write_trace(const std::string& path, const TraceData& data, MPI_Comm comm, bool overwrite = false);

// The provenance group and topology every result file carries: /provenance attributes and
// the /provenance/ranks table (rank, host, device). Collective.
void write_provenance(ResultFile& f, const std::vector<Attr>& provenance, const std::string& host,
                      const std::string& device, MPI_Comm comm);

}  // namespace sb
