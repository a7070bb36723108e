// Reducer: the gradient all-reduce of data-parallel training, bucketed and overlapped with
// backward (as in c10d's Reducer and Horovod's fusion buffer, without a copy into the buffer).
//
// Contract:
// - Every rank constructs it with the same parameter list (checked: names, shapes, dtypes; the
//   error says which parameter differs on which rank) and calls the same methods in the same
//   order. Buckets are reduced in one fixed order on every rank, whatever order gradients land in.
// - Construction runs the check (a collective on `control`: the MPI control plane with CPU
//   tensors, since NCCL takes CUDA tensors only; `comm` itself when it is the MPI one) and then
//   only allocates: every bucket buffer
//   before any parameter is touched, so one that runs out of memory leaves the parameters as they
//   were (the Trainer votes on it).
// - Gradients are views into flat bucket buffers allocated once, here, with each parameter's
//   strides (parameters must be dense: contiguous or another dense format such as channels-last);
//   nothing else may replace a parameter's .grad (zero them with zero_grad()).
// - Per optimizer step: zero_grad(); for each micro-batch begin_micro_batch(last) then backward;
//   finish(). With one rank nothing is posted (the sum is the bucket itself).
//   Micro-batches before the last only accumulate (no_sync); during the last one's
//   backward, a post-accumulate-grad hook marks each parameter ready and a bucket's SUM
//   all-reduce is posted as soon as its last gradient lands. finish() posts what is left and
//   waits for every bucket.
// - reduce_dtype (ddp.reduce_dtype: bf16): each bucket is cast into a persistent buffer of that
//   dtype (allocated here, half the bytes for bf16), all-reduced there and cast back into the
//   float32 bucket, so parameters, gradients and the optimizer stay float32 and only the wire
//   carries bf16; the error this adds is measured in tests/mpi/reduce_dtype_test.cpp.
// - A parameter that got no gradient in the synced backward is an error naming it, unless
//   find_unused_parameters, which reduces whatever it holds (zero if never used) instead.
// - After an out-of-memory error anywhere in the step, abandon() posts every bucket not posted yet
//   (contents are thrown away by the caller) and waits, so the failing rank issues exactly the
//   collectives the others do (docs/DESIGN.md, "The OOM protocol", point 4).
// - Hooks may run on autograd's device threads; the Reducer serialises them with a mutex.
//
// Sharded (ddp.shard: optimizer | gradients; ZeRO-1/2, ddp/shard.h): every bucket is padded to a
// multiple of the world size and each rank owns one contiguous block of it. The parameters become
// views into flat per-bucket parameter buffers laid out like the gradient buckets (the same
// Variables: set_data, as FSDP's flat parameters), so a rank's block of parameters, of gradients
// and of optimizer state is one slice each. Each bucket is reduce-scattered (SUM) into this rank's
// block of reduced gradients (reduced_gradients()), posted from the same hooks and in the same
// order as the all-reduce, so it overlaps backward the same way and the OOM protocol is unchanged.
// The caller updates its blocks (parameter_shards()) and then gather_parameters() all-gathers
// every bucket's parameters in place.
// - optimizer (ZeRO-1): the full buckets stay allocated, as unsharded; the reduced blocks add
//   1/W of the gradient bytes.
// - gradients (ZeRO-2): only the reduced blocks persist. A bucket's full buffer is allocated when
//   its first gradient of the step arrives (a tensor pre-hook, so at that point in backward, not
//   before forward) and freed as soon as its reduce-scatter completes (progress is driven from the
//   hooks, so during backward). Under gradient accumulation the full buffers live from the first
//   micro-batch's backward until the last one's reduce-scatters: accumulation needs the full
//   gradient, so ZeRO-2 saves nothing during accumulation (as DeepSpeed's ZeRO-2 when it reduces
//   once per step); it saves the full gradient in forward, in the optimizer step and all-gather,
//   between steps, and bucket by bucket during the last backward. The per-bucket allocations happen
//   inside the step, so running out there is an ordinary out-of-memory in backward (the protocol
//   retries); abandon() allocates the buckets it must still post (the step's tensors are gone by
//   then). CUDA graphs need fixed addresses and are not used with it (the Trainer says so).
// - parameters (ZeRO-3, ddp/reducer_units.cpp): the buckets are the model's units (a transformer
//   block, the embeddings, the output layer: `units`, one bucket each, the last unit's first), and
//   a rank keeps only its block of each unit's parameters (master_shards(), what the optimizer
//   updates) besides its blocks of gradients and moments. Each parameter stays a view into its
//   unit's flat buffer, whose storage is released while the unit is not gathered (the tensor
//   objects stay, as FSDP1's flat parameters, so references autograd saved do not keep the bytes)
//   and reallocated and all-gathered by gather_unit() / prefetch_unit(). Gradients are per step as
//   under gradients. When the last gradient of a unit lands in a backward (any micro-batch), the
//   unit's parameters are freed: its backward is over. A unit's frozen tensors (LoRA's base:
//   ReducerOptions::frozen) are sharded, gathered and freed with it, and such a unit is freed by
//   the caller once backward has passed it. The caller (train/unit_gate.h) decides when to
//   gather; every rank gathers the same units in the same order.
// Switching a replicated run to sharded in place (the memory.fallback rung shard_optimizer):
// shard_in_place() pads the buckets, allocates the blocks and adopts the flat parameters;
// blocks_of() slices the replicated moments. Both are local (every rank holds the same state).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "ddp/buckets.h"
#include "ddp/communicator.h"
#include "ddp/shard.h"

namespace ddp {

using NamedParameters = std::vector<std::pair<std::string, at::Tensor>>;

struct ReducerOptions {
  int64_t first_bucket_bytes = 1 << 20;
  int64_t bucket_bytes = 25 << 20;
  bool find_unused_parameters = false;
  // Dtype of the all-reduce (Undefined: the gradients' own). Floating-point buckets only.
  c10::ScalarType reduce_dtype = c10::ScalarType::Undefined;
  ShardMode shard = ShardMode::kNone;
  // shard parameters: the model's units in forward order, as indices into the parameter list
  // (every parameter in exactly one unit); empty: the whole model is one unit.
  std::vector<std::vector<size_t>> units{};
  // shard parameters: the dtype units are all-gathered in (the compute dtype under bf16/fp16:
  // half the bytes); the masters stay in theirs and the gathered unit is cast back into them.
  // Undefined: the parameters' own.
  c10::ScalarType gather_dtype = c10::ScalarType::Undefined;
  // Unsharded: float values summed over ranks in the first bucket's all-reduce (rider()).
  int64_t rider_slots = 0;
  // ddp.shard_group: node (hybrid sharding): `comm` spans this node's ranks and the shards are
  // replicated over `replicas` (the ranks of every node with this node rank): each reduced block
  // is all-reduced over it after the node's reduce-scatter, and shard_from() broadcasts over it
  // first. nullptr: the shards span `comm` alone.
  Communicator* replicas = nullptr;
  // shard parameters: the parameters hold no storage yet (a model built deferred,
  // models/deferred_init.h): every unit starts freed with zero masters, which the caller fills
  // (master block by block, parameter_shards()) before masters_filled(). No whole model exists.
  bool deferred = false;
  // shard parameters: tensors each unit holds besides its parameters that take no gradient (a
  // LoRA run's frozen base, which the model keeps as buffers), one list per unit in forward order
  // (empty, or fewer lists than units: the rest hold none). They are sharded and gathered with
  // their unit in a flat buffer of their own (no gradient, no optimizer state, nothing reduced),
  // and a unit that holds any is not freed when its gradients land (its frozen tensors may still
  // be needed for the gradient of its input) but when the gate says its backward is over
  // (free_unit). With `deferred` they hold no storage either, and their masters start at zero.
  std::vector<NamedParameters> frozen{};
};

// Parameters that differ between ranks, or parameters that got no gradient.
class ParameterError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Checks that every rank holds the same parameter list; throws ParameterError naming the first
// parameter that differs and the ranks that disagree. Collective.
void verify_same_parameters(Communicator& comm, const NamedParameters& params);

class Reducer {
 public:
  // `control` runs the parameter check (CPU tensors); nullptr means `comm`, which then must
  // accept CPU tensors (MPI).
  Reducer(NamedParameters params, Communicator& comm, ReducerOptions options,
          Communicator* control = nullptr);
  ~Reducer() noexcept;
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  void zero_grad();  // also starts a new step
  void begin_micro_batch(bool sync);
  void finish();
  void abandon();
  // After micro-batches that all only accumulated (begin_micro_batch(false), as under CUDA graph
  // capture, where a hook must not post a collective): posts every bucket in order and waits.
  // Without hooks marking parameters ready, the unused-parameter check does not run here.
  void reduce_accumulated();

  const std::vector<BucketLayout>& layout() const { return layout_; }
  // The flat gradient buffers, one per bucket: every parameter's gradient exactly once.
  std::vector<at::Tensor> buffers() const;
  // ReducerOptions::rider_slots values (the gradients' dtype, on their device) that ride in the
  // first bucket's all-reduce: the caller writes this rank's values before the synced backward
  // (or reduce_accumulated()) and reads their SUM over ranks after finish(), with no collective of
  // their own (the spike guard's global loss, train/spike_guard.h). Under reduce_dtype they travel
  // in that dtype. With one rank they stay as written. Undefined when sharded (the sum would be
  // scattered) or without slots; shard_in_place() drops them.
  const at::Tensor& rider() const { return rider_; }
  // Bytes of the reduce_dtype copies of the buckets (0 without them).
  int64_t communication_bytes() const;
  // Gradient bytes held between steps: the full buckets (not under ZeRO-2), the reduced blocks
  // (sharded) and the reduce_dtype copies that persist.
  int64_t gradient_bytes() const;

  // Sharding (see above). Unsharded, reduced_gradients() is buffers().
  ShardMode shard_mode() const { return options_.shard; }
  bool sharded() const { return options_.shard != ShardMode::kNone; }
  // After finish(): the reduced gradients this rank uses: the full buckets, or its blocks.
  std::vector<at::Tensor> reduced_gradients() const;
  // Sharded: this rank's block of each bucket's geometry (a view: shards()[b], one per bucket)
  // and of its flat parameters. ShardView, not std::views::transform: clang 14 (the fuzz and
  // sanitizer builds) cannot compile libstdc++ 12's transform_view.
  class ShardView {
   public:
    explicit ShardView(const Reducer& reducer) : reducer_(&reducer) {}
    size_t size() const;
    const BucketShard& operator[](size_t b) const;
    struct Iterator {
      const ShardView* view;
      size_t b;
      const BucketShard& operator*() const { return (*view)[b]; }
      Iterator& operator++() {
        ++b;
        return *this;
      }
      bool operator!=(const Iterator& other) const { return b != other.b; }
    };
    Iterator begin() const { return {this, 0}; }
    Iterator end() const { return {this, size()}; }

   private:
    const Reducer* reducer_;
  };
  ShardView shards() const { return ShardView(*this); }
  std::vector<at::Tensor> parameter_shards() const;
  // Sharded: all-gathers every bucket's parameters from their owners, in place. Collective.
  void gather_parameters();
  // Sharded: every parameter's full tensor (shape, dtype and strides of the parameter), copied to
  // the CPU on `root`, from per-bucket blocks such as parameter_shards() (optimizer moments); one
  // bucket at a time, so the extra device memory is one bucket. Other ranks get an empty vector.
  // root -1: every rank gets them, on the device. Collective.
  std::vector<at::Tensor> unshard(const std::vector<at::Tensor>& blocks, int root);
  // Sharded: fills this rank's per-bucket `blocks` from full per-parameter tensors that rank 0
  // holds (`full`, in parameter order; nullptr on other ranks). Collective.
  void shard_from(const std::vector<at::Tensor>* full, const std::vector<at::Tensor>& blocks);
  // This rank's block of each bucket (as a sharded mode owns it) of full per-parameter tensors
  // that every rank holds alike (replicated optimizer moments); new tensors, one per bucket.
  // Local: no collective.
  std::vector<at::Tensor> blocks_of(const std::vector<at::Tensor>& full) const;
  // Unsharded -> ddp.shard: optimizer (`mode`), between steps (the memory.fallback rung
  // shard_optimizer): the buckets padded, the blocks of reduced gradients allocated, the parameters
  // made views into flat buffers (their values kept). Local: every rank holds the same replicated
  // state, so no collective is needed; all ranks must call it at the same point (an agreed rung).
  void shard_in_place(ShardMode mode);
  // shard parameters (reducer_units.cpp). Units are numbered in forward order (ReducerOptions).
  size_t units() const { return unit_bucket_.size(); }
  bool unit_gathered(size_t unit) const { return buckets_[unit_bucket_.at(unit)].gathered; }
  bool unit_has_parameters(size_t unit) const {
    return !buckets_[unit_bucket_.at(unit)].layout.params.empty();
  }
  // Posts the all-gather of a unit not gathered (its storage reallocated); no wait. Collective.
  void prefetch_unit(size_t unit);
  // The unit's parameters, whole: posts its all-gather unless posted, and waits. Collective.
  void gather_unit(size_t unit);
  // Releases a gathered unit's parameters (waits for its all-gather first). Local.
  void free_unit(size_t unit);
  // Every unit, in unit order; `frozen` false: their parameters alone, the frozen tensors left
  // sharded (a checkpoint, which saves none of them). Collective.
  void gather_all_units(bool frozen = true);
  void free_all_units();  // local
  // After construction (every unit gathered) and the caller's broadcast of the parameters: each
  // rank copies its blocks into its master shards and frees every unit. From then on units are
  // freed when their backward is over. Local.
  void reshard_parameters();
  // ReducerOptions::deferred: the caller has filled every master block; from now on as after
  // reshard_parameters(). Local.
  void masters_filled();
  // The bucket of unit `unit` (units in forward order, buckets the other way round).
  size_t unit_bucket(size_t unit) const { return unit_bucket_.at(unit); }
  // What the rest of `unit`'s backward would do here, without its gradients: each parameter that
  // got none this backward counts as landed (zeros; in a synced micro-batch the buckets are
  // posted in order as they complete, as the hooks post them) and the unit is freed. The dry
  // pass of a rank that ran out of memory (train/unit_gate.h). Collective where it posts.
  void land_unit(size_t unit);
  // Whether any rank passes true: one MAX all-reduce on the Reducer's communicator (the units'),
  // named `what`. Collective.
  bool any_rank(bool mine, const std::string& what);
  // A new pass over the units begins (train/unit_gate.h): no unit's gradients have landed.
  void begin_unit_pass();
  // Whether every gradient of `unit` landed in this pass's backward (or land_unit ran).
  bool unit_landed(size_t unit) const { return buckets_[unit_bucket_.at(unit)].landed; }
  // shard parameters, accumulating (the start-up's probe): a unit's gradient bucket is dropped
  // as soon as its backward ends, so that only one unit's gradients live at a time.
  void set_discard_gradients(bool on) { discard_gradients_ = on; }
  // The bytes of the largest gathered unit (padded flat buffers, its frozen tensors' included).
  int64_t largest_unit_bytes() const;
  // ReducerOptions::frozen: the bytes of this rank's blocks of them (kept for the whole run).
  int64_t frozen_shard_bytes() const;
  // shard parameters: a unit's all-gather while in flight (gather_dtype: the unit as gathered and
  // this rank's block of it, in that dtype).
  struct Gather {
    WorkPtr work;
    at::Tensor wire;
    at::Tensor master_wire;
  };
  // shard parameters: a unit's frozen tensors (ReducerOptions::frozen), laid out, sharded and
  // gathered as its parameters are, in a flat buffer of their own.
  struct Frozen {
    NamedParameters tensors;
    BucketLayout layout;  // params: indices into `tensors`
    BucketShard shard;
    at::Tensor full;    // each tensor is a view into it; storage only while the unit is gathered
    at::Tensor master;  // this rank's block, kept for the whole run
    Gather gather;
    bool gathered = true;  // `full` holds storage (the gather may still be in flight)
  };
  // Unit `unit`'s frozen tensors (none: full undefined). Deferred, the caller fills `master`
  // (this rank's block, by `shard` of the flat `layout`) before masters_filled().
  const Frozen& frozen(size_t unit) const { return buckets_[unit_bucket_.at(unit)].frozen; }
  bool holds_frozen() const { return !options_.frozen.empty(); }
  // Bucket indices in the order their all-reduces were posted in the last synced step.
  const std::vector<size_t>& launch_order() const { return launch_order_; }
  // Buckets posted while backward was still running in the last synced step (overlap).
  size_t launched_during_backward() const { return launched_during_backward_; }

  // Called by the hooks; public for them only.
  void on_gradient_ready(size_t param);
  void on_gradient_arriving(size_t param);  // ZeRO-2: before the gradient is accumulated

 private:
  enum class StepState { kIdle, kAccumulating, kSyncing, kDone };

  // One bucket's state (as c10d's Reducer::Bucket): its buffers, its collective, its readiness.
  // Sharded buckets are padded to shard.padded elements; under ZeRO-2, `gradients` and `wire` exist
  // only while the bucket is in use in a step (acquire_bucket .. release_bucket).
  struct Bucket {
    explicit Bucket(const BucketLayout& l) : layout(l) {}
    const BucketLayout& layout;  // an element of layout_, which never changes
    at::Tensor gradients;        // the flat buffer: each parameter's .grad is a view into it
    at::Tensor carried;          // what the all-reduce carries: `gradients` and the rider after it
    at::Tensor wire;             // its reduce_dtype copy (undefined: none)
    // Sharded (ddp/shard.h):
    BucketShard shard;        // this rank's block
    at::Tensor parameters;    // the flat padded parameters: each parameter is a view into it
    at::Tensor reduced;       // this rank's block of the reduced gradients
    at::Tensor wire_reduced;  // reduce_dtype: that block in the reduce dtype (undefined: none)
    // shard parameters: this rank's block of the parameters, kept for the whole run (the
    // optimizer updates it); `parameters` is then the unit's whole flat buffer, its storage
    // allocated only while `gathered`.
    at::Tensor master;
    Gather gather;             // its all-gather, while in flight
    Frozen frozen;             // its frozen tensors (none: frozen.full undefined)
    bool gathered = true;      // `parameters` holds storage (the gather may still be in flight)
    int64_t unit_pending = 0;  // parameters whose gradient has not landed in this backward
    bool landed = false;       // every one landed in this micro-batch's backward
    // This step:
    int64_t pending = 0;     // parameters not yet ready
    WorkPtr work;            // its all-reduce or reduce-scatter, once posted
    bool completed = false;  // its collective completed
  };

  void start_sync();          // resets per-step readiness; state becomes kSyncing
  void wait_in_flight();      // the posted reduce-scatters, each freed when done (zero3)
  void post_ready_buckets();  // in bucket order, stopping at the first bucket not yet ready
  void mark_all_ready();
  void wait_all();
  void reduce_replicas();  // hybrid sharding: every block all-reduced across nodes, in bucket order
  void drive_progress();
  void post_bucket(size_t b);
  void complete_bucket(Bucket& bucket);  // after its collective completed: cast back, release
  // Sharded (reducer_shard.cpp).
  void setup_shards();                         // blocks, flat parameters; before the gradient views
  void acquire_bucket(Bucket& bucket);         // ZeRO-2: the full buffer and gradient views
  void release_bucket(Bucket& bucket);         // ZeRO-2: frees them
  void point_gradients(const Bucket& bucket);  // each parameter's .grad: a view into gradients
  at::Tensor param_view(const at::Tensor& flat, const BucketLayout& layout, size_t j) const;
  // A bucket's padded flat buffer holding `full`'s parameters of it (zeros where nullptr).
  at::Tensor flat_bucket(const std::vector<at::Tensor>* full, const BucketLayout& layout,
                         const at::TensorOptions& options) const;
  // Only the reduced blocks of the gradients kept between steps, the buckets' full buffers
  // allocated per step (ZeRO-2, gradients, and ZeRO-3, parameters).
  bool shards_gradients() const {
    return options_.shard == ShardMode::kGradients || options_.shard == ShardMode::kParameters;
  }
  bool shards_parameters() const { return options_.shard == ShardMode::kParameters; }
  // shard parameters (reducer_units.cpp).
  std::vector<BucketLayout> unit_layout() const;
  void setup_masters();
  void setup_frozen(Bucket& bucket, NamedParameters tensors);  // flat views, before reshard
  void post_gather(size_t b, bool frozen = true);  // `frozen` false: the parameters alone
  // Posts the all-gather of `master` blocks into `full` (the gather_dtype through a copy).
  void post_flat_gather(const at::Tensor& full, const at::Tensor& master, Gather& gather,
                        const std::string& what);
  void finish_gather(Bucket& bucket);  // waits for its all-gather; casts a gather_dtype copy back
  void release_unit(Bucket& bucket);
  void on_unit_gradient(size_t param);        // a unit's last gradient frees it
  bool has_wire(const Bucket& bucket) const;  // the bucket is reduced in reduce_dtype

  NamedParameters params_;
  Communicator& comm_;
  ReducerOptions options_;
  std::vector<BucketLayout> layout_;
  std::vector<Bucket> buckets_;      // one per element of layout_, in bucket order
  std::vector<size_t> bucket_of_;    // param -> bucket
  std::vector<char> ready_;          // param -> marked ready this step
  std::vector<unsigned> pre_hooks_;  // ZeRO-2: param -> its tensor hook's handle
  std::vector<size_t> unit_bucket_;  // shard parameters: unit -> bucket
  at::Tensor rider_;                 // rider(): the tail of buckets_[0].carried, or standalone
  bool resharded_ = false;           // shard parameters: reshard_parameters() has run
  bool discard_gradients_ = false;   // set_discard_gradients()
  std::vector<size_t> launch_order_;
  size_t next_bucket_ = 0;
  size_t launched_during_backward_ = 0;
  StepState state_ = StepState::kIdle;
  bool in_backward_ = false;
  std::mutex mutex_;
};

inline size_t Reducer::ShardView::size() const { return reducer_->buckets_.size(); }
inline const BucketShard& Reducer::ShardView::operator[](size_t b) const {
  return reducer_->buckets_[b].shard;
}

}  // namespace ddp
