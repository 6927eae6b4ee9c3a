// The bookkeeping of CUDA Graphs for the compute between collectives (graph_segments.h),
// against a stand-in device that records what the CUDA backend would call: captures start at
// the first compute operation and end at a boundary, segment k of every step reuses the
// executable graph of segment k (updated in place, replaced where the update is refused),
// frees inside a capture follow the segment's launch, and an empty segment launches nothing.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "shardbench/backend/graph_segments.h"

namespace sb {
namespace {

struct Recording : GraphDevice {
  std::vector<std::string> calls;
  int graphs = 0, execs = 0, live_execs = 0;
  bool refuse_updates = false;
  static void* handle(int i) { return reinterpret_cast<void*>(intptr_t(i)); }
  static int id(void* p) { return int(reinterpret_cast<intptr_t>(p)); }
  void begin_capture() override { calls.push_back("begin"); }
  Graph end_capture() override {
    calls.push_back("end g" + std::to_string(++graphs));
    return handle(graphs);
  }
  bool update(Exec e, Graph g) override {
    calls.push_back("update e" + std::to_string(id(e)) + " g" + std::to_string(id(g)) + (refuse_updates ? " refused" : ""));
    return !refuse_updates;
  }
  Exec instantiate(Graph g) override {
    ++live_execs;
    calls.push_back("instantiate g" + std::to_string(id(g)) + " -> e" + std::to_string(++execs));
    return handle(execs);
  }
  void launch(Exec e) override { calls.push_back("launch e" + std::to_string(id(e))); }
  void destroy_graph(Graph g) override { calls.push_back("destroy g" + std::to_string(id(g))); }
  void destroy_exec(Exec e) override {
    --live_execs;
    calls.push_back("destroy e" + std::to_string(id(e)));
  }
  void free_ordered(void* p) override { calls.push_back("free " + std::to_string(id(p))); }
};

// One step: two segments separated by a collective, a free inside the first, then sync.
void step(GraphSegments& g) {
  g.compute();
  g.compute();
  g.release(Recording::handle(100));  // a temporary released mid-segment
  g.compute();
  g.boundary();  // a collective
  g.boundary();  // a wait right after: nothing captured, nothing launched
  g.compute();
  g.boundary();  // synchronize
  g.restart();
}

TEST(GraphSegments, StepsBuildGraphsOnceThenUpdateThem) {
  Recording dev;
  {
    GraphSegments g(dev);
    step(g);
    const std::vector<std::string> first = {"begin", "end g1", "instantiate g1 -> e1", "destroy g1", "launch e1",
                                            "free 100", "begin", "end g2", "instantiate g2 -> e2", "destroy g2",
                                            "launch e2"};
    EXPECT_EQ(dev.calls, first);
    dev.calls.clear();
    step(g);
    const std::vector<std::string> second = {"begin", "end g3", "update e1 g3", "destroy g3", "launch e1", "free 100",
                                             "begin", "end g4", "update e2 g4", "destroy g4", "launch e2"};
    EXPECT_EQ(dev.calls, second);
    EXPECT_EQ(g.stats().segments, 4);
    EXPECT_EQ(g.stats().operations, 8);
    EXPECT_EQ(g.stats().instantiated, 2);
    EXPECT_EQ(g.stats().updated, 2);
  }
  EXPECT_EQ(dev.live_execs, 0) << "the executable graphs are destroyed with the segments";
}

TEST(GraphSegments, ARefusedUpdateReplacesTheGraph) {
  Recording dev;
  GraphSegments g(dev);
  step(g);
  dev.calls.clear();
  dev.refuse_updates = true;  // another topology (a different step)
  g.compute();
  g.boundary();
  const std::vector<std::string> want = {"begin", "end g3", "update e1 g3 refused", "destroy e1", "instantiate g3 -> e3",
                                         "destroy g3", "launch e3"};
  EXPECT_EQ(dev.calls, want);
  EXPECT_EQ(dev.live_execs, 2);
}

TEST(GraphSegments, ReleasesOutsideACaptureAreImmediateAndOperationsAreNumbered) {
  Recording dev;
  GraphSegments g(dev);
  g.release(Recording::handle(7));
  EXPECT_EQ(dev.calls, std::vector<std::string>{"free 7"});
  EXPECT_FALSE(g.capturing());
  g.compute();
  EXPECT_TRUE(g.capturing());
  EXPECT_EQ(g.segment(), 0);
  EXPECT_EQ(g.op_in_segment(), 0);
  g.compute();
  EXPECT_EQ(g.op_in_segment(), 1);
  g.boundary();
  EXPECT_EQ(g.segment(), 1);
  g.compute();
  EXPECT_EQ(g.op_in_segment(), 0) << "numbered afresh in each segment";
  g.boundary();
}

}  // namespace
}  // namespace sb
