// CUDA Graphs for the compute between collectives: the bookkeeping (graph_segments.h).
#include "shardbench/backend/graph_segments.h"

#include <cstddef>

namespace sb {

GraphSegments::~GraphSegments() {
  for (GraphDevice::Exec e : execs_)
    if (e) dev_.destroy_exec(e);
}

void GraphSegments::compute() {
  if (!capturing_) {
    dev_.begin_capture();
    capturing_ = true;
    ops_ = 0;
  }
  ++ops_;
}

void GraphSegments::boundary() {
  if (capturing_) {
    capturing_ = false;
    const GraphDevice::Graph g = dev_.end_capture();
    const size_t k = size_t(next_++);
    if (execs_.size() <= k) execs_.resize(k + 1, nullptr);
    if (execs_[k] && dev_.update(execs_[k], g)) {
      ++stats_.updated;
    } else {
      if (execs_[k]) dev_.destroy_exec(execs_[k]);
      execs_[k] = dev_.instantiate(g);
      ++stats_.instantiated;
    }
    dev_.destroy_graph(g);
    dev_.launch(execs_[k]);
    ++stats_.segments;
    stats_.operations += ops_;
  }
  for (void* p : deferred_) dev_.free_ordered(p);
  deferred_.clear();
}

void GraphSegments::release(void* p) {
  if (capturing_)
    deferred_.push_back(p);
  else
    dev_.free_ordered(p);
}

}  // namespace sb
