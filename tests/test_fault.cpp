// Test-only fault injection (core/fault.h): SHARDBENCH_INJECT_FAULT's values, each fault of
// the list by its name, the delays' seconds, and every other value refused naming the list.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <utility>

#include "shardbench/core/check.h"
#include "shardbench/core/fault.h"

using namespace sb;

TEST(Fault, EveryFaultOfTheListByItsName) {
  EXPECT_FALSE(parse_fault_choice("").any);
  const std::pair<const char*, Fault> named[] = {{"drop-grad-shard", Fault::DropGradShard},
                                                 {"wrong-reduction-scale", Fault::WrongReductionScale},
                                                 {"stale-prefetch", Fault::StalePrefetch},
                                                 {"tp-skip-attention-all-reduce", Fault::TpSkipAttentionAllReduce},
                                                 {"tp-skip-feed-forward-all-reduce", Fault::TpSkipFeedForwardAllReduce},
                                                 {"tp-wrong-head-shard", Fault::TpWrongHeadShard},
                                                 {"tp-wrong-vocab-offset", Fault::TpWrongVocabOffset},
                                                 {"tp-bf16-gradient-all-reduce", Fault::TpBf16GradientAllReduce}};
  for (const auto& [name, fault] : named) {
    const FaultChoice c = parse_fault_choice(name);
    EXPECT_TRUE(c.any) << name;
    EXPECT_EQ(c.fault, fault) << name;
    EXPECT_EQ(c.seconds, 0u) << name;
  }
  const FaultChoice w = parse_fault_choice("write-delay=1");
  EXPECT_TRUE(w.any && w.fault == Fault::WriteDelay && w.seconds == 1);
  const FaultChoice p = parse_fault_choice("publish-delay=60");
  EXPECT_TRUE(p.any && p.fault == Fault::PublishDelay && p.seconds == 60);
}

TEST(Fault, AnythingElseIsRefusedNamingTheList) {
  for (const char* v : {"drop-grad-shards", "publish-delay", "publish-delay=", "publish-delay=-1", "publish-delay=2s",
                        "publish-delay=86401", "stale-prefetch=1", "DROP-GRAD-SHARD"}) {
    try {
      parse_fault_choice(v);
      ADD_FAILURE() << v << " was accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("SHARDBENCH_INJECT_FAULT '") + v + "' is not allowed"),
                std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("publish-delay=SECONDS"), std::string::npos) << e.what();
    }
  }
}

TEST(Fault, NoneWithoutTheVariable) {
  if (std::getenv("SHARDBENCH_INJECT_FAULT")) GTEST_SKIP() << "SHARDBENCH_INJECT_FAULT is set";
  for (Fault f : {Fault::DropGradShard, Fault::WrongReductionScale, Fault::StalePrefetch,
                  Fault::TpSkipAttentionAllReduce, Fault::TpSkipFeedForwardAllReduce, Fault::TpWrongHeadShard,
                  Fault::TpWrongVocabOffset, Fault::TpBf16GradientAllReduce, Fault::WriteDelay, Fault::PublishDelay})
    EXPECT_FALSE(injected_fault(f));
}
