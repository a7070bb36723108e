// Deferred initialisation: a model built without storage for its parameters, initialised later
// unit by unit (ddp.shard: parameters: docs/DESIGN.md, "Parameters sharded"; FSDP2's meta-device
// build, DeepSpeed's zero.Init).
//
// Note [Deferred initialisation]
// Inside a DeferredInit scope, new_parameter() makes a tensor of the parameter's shape, dtype and
// device that holds no bytes (its storage is empty, as a freed unit's: ddp/reducer_units.cpp), and
// init_parameter() records the initialisation instead of running it: a function of the tensor,
// and whether it draws from the default CPU generator. The scope keeps the generator's state at
// its start. materialise() later runs those functions on real tensors of the same shapes, in
// the order they were recorded, from that state: the draws are the ones the constructor would
// have made, so a deferred model's values are those of the same model built whole, whatever the
// world size (every rank computes every unit, and keeps its block). The draws must come in their
// recorded order: materialise_units() fills one unit at a time, each when the record reaches its
// last draw, and makes the draws of a unit it passed earlier (gpt draws wte's N(0, 1) first and
// GPT-2's N(0, 0.02) for it after every block) from the generator's state it kept there.
// Initialisations that draw nothing (norms' ones, biases' zeros) run in their recorded order too.
//
// A model is deferred only where its constructors make their parameters through new_parameter()
// and initialise them through init_parameter() (models/block.h's parts, models/embedding.h; the
// language models use nothing else). A parameter some module allocated for real inside the scope
// keeps its values: finish() records a copy of it. A module that draws random numbers for real
// inside the scope would shift the replayed sequence: finish() refuses it (std::logic_error).
//
// model.init_from under a scope reads nothing at construction: the family checks the files'
// headers and sets DeferredRecord::read, which reads element ranges of a parameter from the files
// (models/lm/hf_ranges.h), so that each rank reads only its blocks.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace models {

// Elements [first, first + out.numel()) of the parameter `name` seen flat (row-major), into `out`
// (float32, CPU, contiguous). Throws std::invalid_argument naming the file it cannot read.
using ParameterReader =
    std::function<void(const std::string& name, int64_t first, const at::Tensor& out)>;

struct DeferredRecord {
  struct Init {
    at::Tensor parameter;                         // as constructed (later: the model's Variable)
    std::function<void(const at::Tensor&)> fill;  // run on a tensor of its shape, under no-grad
    bool random = true;                           // draws from the default CPU generator
  };
  c10::Device device{c10::kCPU};  // where the parameters live
  at::Tensor generator_state;     // the default CPU generator's, when the scope began
  std::vector<Init> inits;        // in call order
  // model.init_from by ranges; empty: the inits give the values.
  ParameterReader read;
  // What `read` reads, for messages ("model.init_from DIR").
  std::string source;
  // model.lora_init_from by ranges: a LoRA model's parameters (its adapters) read over their
  // replayed initialisations, after the frozen base; empty: none.
  ParameterReader read_adapters;
};

class DeferredInit {
 public:
  // Parameters made inside the scope live on `device` and hold no storage. Scopes do not nest.
  explicit DeferredInit(c10::Device device);
  ~DeferredInit();
  DeferredInit(const DeferredInit&) = delete;
  DeferredInit& operator=(const DeferredInit&) = delete;

  // The scope open on this thread, or null.
  static DeferredInit* current();
  DeferredRecord& record() { return *record_; }
  // Ends the recording for `model` (built inside the scope): its parameters that hold storage get
  // a copy of their values recorded. Throws std::logic_error when the construction drew random
  // numbers for real (see the note).
  std::shared_ptr<DeferredRecord> finish(torch::nn::Module& model);

 private:
  std::shared_ptr<DeferredRecord> record_;
};

// A float32 tensor of `shape` for a module's parameter: allocated (uninitialised) on the CPU, or
// inside a DeferredInit scope on its device without storage.
at::Tensor new_parameter(at::IntArrayRef shape);
// Runs `fill` on `parameter` under no-grad now, or, for a parameter new_parameter() made inside a
// scope, records it (`random`: it draws from the default CPU generator).
void init_parameter(const at::Tensor& parameter, std::function<void(const at::Tensor&)> fill,
                    bool random = true);
// A tensor of `shape` (contiguous) with no bytes: numel > 0, storage empty. Reading it is an error.
at::Tensor tensor_without_storage(at::IntArrayRef shape, const at::TensorOptions& options);
// Whether `t` has elements but no bytes (made without storage, or a freed unit's view).
bool holds_no_storage(const at::Tensor& t);

// Replays `record` unit by unit (see the note): `units` lists each unit's parameters (the model's,
// matched to the record by identity); every parameter must be in one unit and have a recorded
// initialisation. For each unit, materialise_units calls `open(u)` for the tensors to fill (one
// of each parameter's shape, in the order of units[u], any device), fills them in the recorded
// order, and then calls `close(u)`; one unit is open at a time. The units are opened in the order
// the record allows: a unit whose draws are interrupted by another unit's is filled once its last
// draw comes, the draws before it made from the generator states kept when they were passed (and
// made once more for real then: a few extra draws, never a second unit in memory). The default
// CPU generator ends where the constructor would have left it. Throws std::logic_error for a
// parameter without a recorded initialisation or outside every unit.
void materialise_units(const DeferredRecord& record,
                       const std::vector<std::vector<at::Tensor>>& units,
                       const std::function<std::vector<at::Tensor>(size_t unit)>& open,
                       const std::function<void(size_t unit)>& close);

}  // namespace models
