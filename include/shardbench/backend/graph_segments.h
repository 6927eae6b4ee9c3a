// CUDA Graphs for the compute between collectives (ComputeOptions::graphs, --cuda-graphs):
// the bookkeeping, free of CUDA, so that it is unit-tested without a GPU
// (tests/test_graph_segments.cpp); the CUDA backend implements GraphDevice.
//
// A segment is the run of compute operations between two boundaries. Its first operation
// starts a stream capture of the compute stream; a boundary — anything that cannot be
// captured or must happen at its place on the host: an allocation, a copy from or to the
// host, a collective, a wait, a synchronisation — ends the capture and launches the
// segment's graph. Segments are numbered from each synchronize() (once per step), and
// segment k of a step reuses the executable graph of segment k of the step before: the
// captured graph updates it in place (cudaGraphExecUpdate: same topology, new pointers and
// scalars) or, where the update is refused, replaces it. So a step's graphs are built once
// and then only updated, and what runs is always exactly what was issued this time.
// Releases inside a segment are stream-ordered frees issued after the segment's launch
// (a free cannot be captured); the ledger has counted them free at release, as always.
#pragma once
#include <cstdint>
#include <vector>

namespace sb {

class GraphDevice {
 public:
  using Graph = void*;  // cudaGraph_t
  using Exec = void*;   // cudaGraphExec_t
  virtual ~GraphDevice() = default;
  virtual void begin_capture() = 0;               // of the compute stream
  virtual Graph end_capture() = 0;                // the graph captured since begin_capture
  virtual bool update(Exec e, Graph g) = 0;       // e now runs g; false: refused, e unchanged
  virtual Exec instantiate(Graph g) = 0;
  virtual void launch(Exec e) = 0;                // on the compute stream
  virtual void destroy_graph(Graph g) = 0;
  virtual void destroy_exec(Exec e) = 0;
  virtual void free_ordered(void* p) = 0;         // stream-ordered free on the compute stream
};

class GraphSegments {
 public:
  explicit GraphSegments(GraphDevice& device) : dev_(device) {}
  GraphSegments(const GraphSegments&) = delete;
  GraphSegments& operator=(const GraphSegments&) = delete;
  ~GraphSegments();  // destroys the executable graphs (call boundary() first)

  // Before a compute operation on the compute stream: starts a capture unless one runs.
  void compute();
  // Before anything that cannot be captured: ends the capture, launches the segment, then
  // issues the frees deferred during it.
  void boundary();
  // A release: deferred to after the segment while capturing, else freed at once.
  void release(void* p);
  // After a synchronize: the next segment is segment 0 of a step again.
  void restart() { next_ = 0; }

  bool capturing() const { return capturing_; }
  int segment() const { return next_; }          // the segment being captured (or the next one)
  int op_in_segment() const { return ops_ - 1; }  // the current operation's index in it
  struct Stats {
    int64_t segments = 0, operations = 0, instantiated = 0, updated = 0;
  };
  const Stats& stats() const { return stats_; }

 private:
  GraphDevice& dev_;
  bool capturing_ = false;
  int next_ = 0, ops_ = 0;
  std::vector<GraphDevice::Exec> execs_;  // per segment number
  std::vector<void*> deferred_;
  Stats stats_;
};

}  // namespace sb
