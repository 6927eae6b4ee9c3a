// Test fixture shared by tests/test_t5.cpp and tests/gpu/test_cuda_backend.cu: one rank's
// full model on a backend — every unit's parameters (initialised from a seed in fp32, then
// cast to the model's dtype) and gradients, and a T5Step with that seed's tokens.
#pragma once
#include <memory>
#include <vector>

#include "shardbench/backend/backend.h"
#include "shardbench/core/half.h"
#include "shardbench/model/model.h"
#include "shardbench/model/t5.h"

namespace sb {

// n elements of a backend tensor of any training precision, as fp32 on the host.
inline std::vector<float> download_f32(Backend& b, CBuf src, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  if (src.dtype == DType::F32) {
    b.download(out.data(), src.ptr, size_t(n) * 4);
    return out;
  }
  std::vector<uint16_t> bits(static_cast<size_t>(n));
  b.download(bits.data(), src.ptr, size_t(n) * 2);
  for (size_t i = 0; i < bits.size(); ++i)
    out[i] = src.dtype == DType::BF16 ? bf16_bits_to_float(bits[i]) : f16_bits_to_float(bits[i]);
  return out;
}

// Host data as a backend tensor of type t (uploaded in fp32, cast there: rounded to t),
// in Workspace; the caller releases it.
inline Buf upload_as(Backend& b, const std::vector<float>& h, DType t) {
  float* f = b.alloc_floats(int64_t(h.size()), MemCategory::Workspace);
  b.upload(f, h.data(), h.size() * 4);
  const Buf out = b.alloc_buf(int64_t(h.size()), t, MemCategory::Workspace);
  b.cast(out, f, int64_t(h.size()));
  b.release(f);
  return out;
}

struct T5Model {
  static constexpr uint64_t kSeed = 1234;
  Backend& b;
  StepShape shape;
  float grad_scale;  // d(loss)/d(loss sum); the step's gradients are loss_scale times larger
  float loss_scale;
  std::unique_ptr<T5Step> step;
  std::vector<Buf> params, grads;

  T5Model(Backend& be, const ModelSpec& spec, const StepShape& x, bool ckpt, DType dtype = DType::F32,
          float loss_scale_ = 1.f, AttentionImpl attention = AttentionImpl::Unfused)
      : b(be), shape(x), grad_scale(1.f / float(x.batch * x.dec_len)), loss_scale(loss_scale_) {
    T5StepConfig config;
    config.spec = spec;
    config.dtype = dtype;
    config.shape = x;
    config.checkpointing = ckpt;
    config.grad_scale = grad_scale * loss_scale;
    config.attention = attention;
    step = std::make_unique<T5Step>(b, config);
    const auto& units = step->units();
    for (size_t u = 0; u < units.size(); ++u) {
      float* master = b.alloc_floats(units[u].numel, MemCategory::Workspace);
      init_unit_params(b, units[u], kSeed, master, 0, units[u].numel);
      params.push_back(b.alloc_buf(units[u].numel, dtype, MemCategory::Parameters));
      b.cast(params.back(), master, units[u].numel);
      b.release(master);
      grads.push_back(b.alloc_buf(units[u].numel, dtype, MemCategory::Gradients));
    }
    step->set_tokens(make_tokens(kSeed, 0, 0, x, spec.vocab));
  }
  ~T5Model() {
    step.reset();
    for (const Buf& p : params) b.release(p.ptr);
    for (const Buf& g : grads) b.release(g.ptr);
    b.synchronize();
  }
  T5Model(const T5Model&) = delete;
  T5Model& operator=(const T5Model&) = delete;
};

}  // namespace sb
