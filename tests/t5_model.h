// Test fixture shared by tests/test_t5.cpp and tests/gpu/test_cuda_backend.cu: one rank's
// full model on a backend — every unit's parameters (initialised from a seed) and
// gradients, and a T5Step with that seed's tokens.
#pragma once
#include <memory>
#include <vector>

#include "shardbench/backend.h"
#include "shardbench/model.h"
#include "shardbench/t5.h"

namespace sb {

struct T5Model {
  static constexpr uint64_t kSeed = 1234;
  Backend& b;
  StepShape shape;
  float grad_scale;
  std::unique_ptr<T5Step> step;
  std::vector<float*> params, grads;

  T5Model(Backend& be, const ModelSpec& spec, const StepShape& x, bool ckpt)
      : b(be), shape(x), grad_scale(1.f / float(x.batch * x.dec_len)) {
    step = std::make_unique<T5Step>(spec, b, x, ckpt, grad_scale);
    const auto& units = step->units();
    for (size_t u = 0; u < units.size(); ++u) {
      params.push_back(b.alloc_floats(units[u].numel, MemCategory::Parameters));
      grads.push_back(b.alloc_floats(units[u].numel, MemCategory::Gradients));
      init_unit_params(b, units[u], int(u), kSeed, params[u], 0, units[u].numel);
    }
    step->set_tokens(make_tokens(kSeed, 0, 0, x, spec.vocab));
  }
  ~T5Model() {
    step.reset();
    for (float* p : params) b.release(p);
    for (float* g : grads) b.release(g);
    b.synchronize();
  }
  T5Model(const T5Model&) = delete;
  T5Model& operator=(const T5Model&) = delete;
};

}  // namespace sb
