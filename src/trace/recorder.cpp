#include "shardbench/trace.h"

namespace sb {

void TraceRecorder::begin_step(int step, double t) {
  cur_ = StepStats{};
  cur_.step = step;
  cur_.start = t;
  events_.clear();
}

StepStats TraceRecorder::end_step(double t, int64_t peak_memory) {
  cur_.end = t;
  cur_.peak_memory = peak_memory;
  return cur_;
}

void TraceRecorder::on_op(const OpEvent& e) {
  const double d = e.end - e.start;
  if (is_communication(e.kind)) {
    cur_.communication += d;
    cur_.comm_bytes += e.bytes;
  } else if (e.kind == OpKind::Wait || e.kind == OpKind::Progress) {
    cur_.exposed_comm += d;
  } else {
    cur_.compute += d;
    if (e.kind == OpKind::Gemm) {
      cur_.gemm += d;
      cur_.gemm_flops += e.flops;
    }
  }
  events_.push_back(e);
}

}  // namespace sb
