#include "shardbench/core/fault.h"

#include <cstdlib>
#include <string>

#include "shardbench/core/check.h"

namespace sb {
namespace {

// The list of fault.h, one row per fault: its name and whether it takes =SECONDS.
struct FaultInfo {
  Fault fault;
  const char* name;
  bool delay;
};
constexpr FaultInfo kFaults[] = {
    {Fault::DropGradShard, "drop-grad-shard", false},
    {Fault::WrongReductionScale, "wrong-reduction-scale", false},
    {Fault::StalePrefetch, "stale-prefetch", false},
    {Fault::Zero1SkipParamGather, "zero1-skip-param-gather", false},
    {Fault::OffloadSkipUpload, "offload-skip-upload", false},
    {Fault::TpSkipAttentionAllReduce, "tp-skip-attention-all-reduce", false},
    {Fault::TpSkipFeedForwardAllReduce, "tp-skip-feed-forward-all-reduce", false},
    {Fault::TpWrongHeadShard, "tp-wrong-head-shard", false},
    {Fault::TpWrongVocabOffset, "tp-wrong-vocab-offset", false},
    {Fault::TpBf16GradientAllReduce, "tp-bf16-gradient-all-reduce", false},
    {Fault::WriteDelay, "write-delay", true},
    {Fault::PublishDelay, "publish-delay", true},
    {Fault::RecordDelay, "record-delay", true},
};

std::string known_faults() {
  std::string s;
  for (const FaultInfo& f : kFaults) s += std::string(s.empty() ? "" : ", ") + f.name + (f.delay ? "=SECONDS" : "");
  return s;
}

}  // namespace

FaultChoice parse_fault_choice(const std::string& v) {
  if (v.empty()) return {};
  const size_t eq = v.find('=');
  const std::string name = v.substr(0, eq);
  for (const FaultInfo& f : kFaults) {
    if (name != f.name) continue;
    FaultChoice c{true, f.fault, 0};
    if (!f.delay && eq == std::string::npos) return c;
    if (f.delay && eq != std::string::npos) {
      const std::string s = v.substr(eq + 1);
      char* end = nullptr;
      const unsigned long n = s.empty() ? 0 : std::strtoul(s.c_str(), &end, 10);
      if (!s.empty() && *end == '\0' && s[0] != '-' && n <= 86400) {
        c.seconds = unsigned(n);
        return c;
      }
    }
    break;
  }
  throw UsageError("SHARDBENCH_INJECT_FAULT '" + v + "' is not allowed (test only; allowed: " + known_faults() +
                   ", SECONDS an integer 0..86400)");
}

InjectedFault injected_fault(Fault f) {
  static const FaultChoice chosen = [] {
    const char* v = std::getenv("SHARDBENCH_INJECT_FAULT");
    try {
      return parse_fault_choice(v ? v : "");
    } catch (const UsageError& e) {
      SB_FATAL(e.what());
    }
  }();
  if (!chosen.any || chosen.fault != f) return {};
  return {true, chosen.seconds};
}

}  // namespace sb
