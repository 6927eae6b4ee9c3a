// --check's reference models (reference_step.h).
#include "shardbench/train/reference_step.h"

namespace sb {

std::unique_ptr<T5Step> make_reference_step(const Setup& setup, Backend& b, DType dtype, float grad_scale,
                                            TensorGroup tp) {
  T5StepConfig c;
  c.spec = setup.model;
  c.dtype = dtype;
  c.shape = StepShape{setup.shape.batch / setup.strategy.micro_batches, setup.shape.enc_len, setup.shape.dec_len};
  c.checkpointing = setup.strategy.checkpointing;
  c.grad_scale = grad_scale;
  c.attention = setup.strategy.attention;  // the run's attention path
  c.tp = tp;
  // Every piece, the table's gradient folded where the run's stages start.
  c.part.stage_starts.assign(setup.split.first.begin(), setup.split.first.end() - 1);
  return std::make_unique<T5Step>(b, c);
}

void ReferenceModel::make(const Setup& setup, Backend& b, DType dtype, float grad_scale, TensorGroup tp) {
  step = make_reference_step(setup, b, dtype, grad_scale, tp);
  for (const UnitSpec& u : step->units()) {
    params.push_back(b.alloc_buf(u.numel, dtype, MemCategory::Parameters));
    grads.push_back(b.alloc_buf(u.numel, dtype, MemCategory::Gradients));
  }
}

void ReferenceModel::release(Backend& b) {
  step.reset();
  for (size_t k = 0; k < params.size(); ++k) b.release(params[k].ptr), b.release(grads[k].ptr);
  params.clear();
  grads.clear();
}

}  // namespace sb
