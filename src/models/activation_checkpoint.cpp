#include "models/activation_checkpoint.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <mutex>
#include <utility>

namespace models {
namespace {

// Note [Checkpointed blocks]
// A checkpointed block runs forward without recording a graph and keeps only its input. Backward
// re-runs it with grad enabled on a detached copy of the input and calls backward on that
// recomputation re-entrantly (as PyTorch's reentrant torch.utils.checkpoint does), so the block's
// parameters accumulate into .grad through their own AccumulateGrad nodes, and their
// post-accumulate-grad hooks (the Reducer's bucket triggers) fire once per backward, exactly as
// without checkpointing. The parameters are reached through the recomputation, never passed as
// inputs of the function: as inputs, autograd would produce their gradients a second time.
// The recomputation sees what the first run saw: the RNG state (CPU default generator, and the
// CUDA one of the input's device), so dropout draws the same masks, and the autocast state, so
// it computes in the same precision (backward runs outside the trainer's autocast scope). The
// generators are put back afterwards: checkpointing leaves the random stream as it found it.
// A segment whose input needs no gradient (the first block of a model whose embeddings are frozen:
// LoRA) would give an output without a graph, as any autograd function whose inputs need none,
// and the adapters inside would get no gradient; such an input enters as a fresh leaf that
// requires one (as transformers' enable_input_require_grads does for PEFT with gradient
// checkpointing), whose gradient nobody reads.

// What a checkpointed segment recomputes. Held in the autograd context (as a capsule: the one
// IValue that holds an arbitrary C++ object), so the graph keeps the block, and with it its
// parameters, alive until backward has run.
struct Segment final : torch::CustomClassHolder {
  explicit Segment(std::function<at::Tensor(const at::Tensor&)> f) : run(std::move(f)) {}
  std::function<at::Tensor(const at::Tensor&)> run;
};

// The random and autocast state a segment ran under (Note [Checkpointed blocks]).
struct RecomputeState {
  at::Tensor cpu_rng;
  at::Tensor cuda_rng;  // defined when the input is on a CUDA device
  bool autocast = false;
  at::ScalarType autocast_dtype = at::kBFloat16;

  static RecomputeState capture(const at::Tensor& x) {
    RecomputeState s;
    s.cpu_rng = get(cpu_generator());
    if (x.is_cuda()) s.cuda_rng = get(cuda_generator(x.device()));
    s.autocast = at::autocast::is_autocast_enabled(x.device().type());
    s.autocast_dtype = at::autocast::get_autocast_dtype(x.device().type());
    return s;
  }

  void save(torch::autograd::AutogradContext* ctx) const {
    ctx->saved_data["cpu_rng"] = cpu_rng;
    if (cuda_rng.defined()) ctx->saved_data["cuda_rng"] = cuda_rng;
    ctx->saved_data["autocast"] = autocast;
    ctx->saved_data["autocast_dtype"] = static_cast<int64_t>(autocast_dtype);
  }

  static RecomputeState load(torch::autograd::AutogradContext* ctx) {
    RecomputeState s;
    s.cpu_rng = ctx->saved_data.at("cpu_rng").toTensor();
    if (ctx->saved_data.count("cuda_rng")) s.cuda_rng = ctx->saved_data.at("cuda_rng").toTensor();
    s.autocast = ctx->saved_data.at("autocast").toBool();
    s.autocast_dtype = static_cast<at::ScalarType>(ctx->saved_data.at("autocast_dtype").toInt());
    return s;
  }

  static at::Generator cpu_generator() { return at::globalContext().defaultGenerator(at::kCPU); }
  static at::Generator cuda_generator(c10::Device device) {
    return at::globalContext().defaultGenerator(device);
  }
  static at::Tensor get(at::Generator gen) {
    std::lock_guard<std::mutex> lock(gen.mutex());
    return gen.get_state();
  }
  static void set(at::Generator gen, const at::Tensor& state) {
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(state);
  }
};

// Puts a RecomputeState in place for its lifetime, then restores what was there (RNG and autocast).
class RecomputeStateScope {
 public:
  RecomputeStateScope(const RecomputeState& s, c10::Device device) : device_(device) {
    now_cpu_ = RecomputeState::get(RecomputeState::cpu_generator());
    RecomputeState::set(RecomputeState::cpu_generator(), s.cpu_rng);
    if (s.cuda_rng.defined()) {
      now_cuda_ = RecomputeState::get(RecomputeState::cuda_generator(device));
      RecomputeState::set(RecomputeState::cuda_generator(device), s.cuda_rng);
    }
    const auto type = device.type();
    was_autocast_ = at::autocast::is_autocast_enabled(type);
    was_dtype_ = at::autocast::get_autocast_dtype(type);
    at::autocast::set_autocast_dtype(type, s.autocast_dtype);
    at::autocast::set_autocast_enabled(type, s.autocast);
    if (s.autocast) at::autocast::increment_nesting();
    autocast_ = s.autocast;
  }
  ~RecomputeStateScope() {
    const auto type = device_.type();
    // As the trainer's AutocastScope: the outermost scope drops the cached casts of the weights.
    if (autocast_ && at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(type, was_autocast_);
    at::autocast::set_autocast_dtype(type, was_dtype_);
    RecomputeState::set(RecomputeState::cpu_generator(), now_cpu_);
    if (now_cuda_.defined())
      RecomputeState::set(RecomputeState::cuda_generator(device_), now_cuda_);
  }
  RecomputeStateScope(const RecomputeStateScope&) = delete;
  RecomputeStateScope& operator=(const RecomputeStateScope&) = delete;

 private:
  c10::Device device_;
  at::Tensor now_cpu_, now_cuda_;
  bool autocast_ = false, was_autocast_ = false;
  at::ScalarType was_dtype_ = at::kBFloat16;
};

struct CheckpointFunction final : torch::autograd::Function<CheckpointFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const c10::intrusive_ptr<Segment>& segment) {
    ctx->saved_data["segment"] = c10::IValue::make_capsule(segment);
    RecomputeState::capture(x).save(ctx);
    ctx->save_for_backward({x});
    at::NoGradGuard no_grad;  // no graph, so no saved activations (apply disables grad too)
    return segment->run(x);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto segment =
        c10::static_intrusive_pointer_cast<Segment>(ctx->saved_data.at("segment").toCapsule());
    const at::Tensor x = ctx->get_saved_variables().at(0).detach().requires_grad_(true);
    at::Tensor y;
    {
      RecomputeStateScope same_as_forward(RecomputeState::load(ctx), x.device());
      at::AutoGradMode enable_grad(true);
      y = segment->run(x);
    }
    // Re-entrant: accumulates into the block's parameters' .grad (and x's), firing their hooks.
    torch::autograd::backward({y}, {grads.at(0)});
    return {x.grad(), at::Tensor()};
  }
};

}  // namespace

at::Tensor checkpoint(std::function<at::Tensor(const at::Tensor&)> f, const at::Tensor& x) {
  const at::Tensor input = x.requires_grad() ? x : x.detach().requires_grad_(true);
  return CheckpointFunction::apply(input, c10::make_intrusive<Segment>(std::move(f)));
}

}  // namespace models
