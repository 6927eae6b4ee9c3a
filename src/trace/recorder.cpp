#include "shardbench/trace/trace.h"

namespace sb {

void TraceRecorder::begin_step(int step, double t) {
  cur_ = StepStats{};
  cur_.step = step;
  cur_.start = t - origin_;
}

StepStats TraceRecorder::end_step(double t, int64_t peak_memory) {
  cur_.end = t - origin_;
  cur_.peak_memory = peak_memory;
  return cur_;
}

void TraceRecorder::on_op(const OpEvent& e) {
  const double d = e.end - e.start;
  if (is_offload_lane(e.lane)) {  // host offload: neither the device's compute nor communication
    if (e.kind == OpKind::Copy) cur_.offload_copy += d;
    else if (e.kind != OpKind::Wait) cur_.host_compute += d;
  } else if (is_communication(e.kind)) {
    cur_.communication += d;
    cur_.comm_bytes += e.bytes;
    cur_.sent_bytes += bytes_sent(e);
  } else if (e.lane != 0) {  // a collective's own copies (CUDA over MPI: staging through host memory)
    cur_.communication += d;
  } else if (e.kind == OpKind::Wait || e.kind == OpKind::Progress) {
    cur_.exposed_comm += d;
  } else {
    cur_.compute += d;
    if (e.kind == OpKind::Gemm) {
      cur_.gemm += d;
      cur_.gemm_flops += e.flops;
    }
  }
  if (!keep_) return;
  TraceEvent te{cur_.step, e};
  te.op.start -= origin_;
  te.op.end -= origin_;
  events_.push_back(te);
}

void TraceRecorder::on_memory(double t, const MemBytes& current) {
  if (keep_) memory_.push_back(MemorySample{cur_.step, t - origin_, current});
}

void TraceRecorder::on_host_memory(double t, const MemBytes& current) {
  if (keep_) host_memory_.push_back(MemorySample{cur_.step, t - origin_, current});
}

std::vector<OpEvent> TraceRecorder::step_events(int step) const {
  std::vector<OpEvent> out;
  for (const TraceEvent& e : events_)
    if (e.step == step) out.push_back(e.op);
  return out;
}

}  // namespace sb
