// Trace: receives the backend's operations and memory changes and turns them into
// per-step figures (compute, communication, exposed communication, GEMM rate) and the
// event list of each step.
#pragma once
#include <vector>

#include "shardbench/backend.h"

namespace sb {

struct StepStats {
  int step = 0;
  double start = 0, end = 0;       // backend clock, seconds
  double compute = 0;              // compute-lane operations, waits excluded
  double gemm = 0;                 // of which GEMMs
  double gemm_flops = 0;           // FLOPs of those GEMMs
  double communication = 0;        // collectives, issue to observed completion, all lanes
  double exposed_comm = 0;         // compute lane in wait() or driving MPI progress
  int64_t comm_bytes = 0;
  double loss = 0;                 // this rank's mean token loss
  int64_t peak_memory = 0;         // backend-accounted, all categories, this step
  double time() const { return end - start; }
  // Time not spent in a compute operation or waiting for communication: the harness's own.
  double overhead() const { return time() - compute - exposed_comm; }
};

class TraceRecorder : public Recorder {
 public:
  void begin_step(int step, double t);
  StepStats end_step(double t, int64_t peak_memory);
  void on_op(const OpEvent& e) override;
  void on_memory(double t, const MemBytes& current) override {}
  const std::vector<OpEvent>& events() const { return events_; }  // of the current step

 private:
  StepStats cur_;
  std::vector<OpEvent> events_;
};

}  // namespace sb
