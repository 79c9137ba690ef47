// Optimizer states and the temporaries of optimizer.step(), per implementation.
//
// States (created lazily by the first step, as torch.optim does):
//   SGD: none · SGD with momentum: momentum_buffer (1×) · Adam/AdamW: exp_avg, exp_avg_sq (2×)
//   Adafactor (HF transformers / Shazeer & Stern 2018): for a tensor of shape [..., n, m] a row
//   factor of prod(shape[:-1]) and a column factor of prod(shape[:-2])·m values, a full second
//   moment for vectors, plus a full exp_avg when β1 is set; always fp32.
// Temporaries (intermediates):
//   foreach Adam/AdamW: torch._foreach_sqrt(exp_avg_sqs) makes a state-sized copy of every
//     parameter, one allocation each, all alive at once (then divided and ε-added in place,
//     consumed by _foreach_addcdiv_).
//   per-parameter Adam/AdamW: (exp_avg_sq.sqrt() / bias_correction2_sqrt) holds two copies of
//     one parameter for an instant.
//   Adafactor (per parameter): grad², grad²+ε, the factored update and −update: two copies of
//     one parameter at most, plus fp32 copies of a 16-bit parameter and gradient.
//   SGD and momentum (no weight decay): in place, none.
//   fused: the kernel reads and writes in place, none.
//   Mixed precision: the 16-bit gradients are upcast to fp32 for the master update (with foreach
//     every one, one allocation each, before the step creates its states; one tensor at a time
//     per parameter; not at all when fused).
// bitsandbytes (bitsandbytes/optim/optimizer.py):
//   Optimizer2State.init_state: optim_bits 8 → state1, state2 uint8 (get_state_buffer) and, with
//     block_wise (the default), absmax1, absmax2 fp32 of ceil(n / 256) blocks; a tensor with
//     p.numel() < min_8bit_size (4,096) keeps fp32 state1, state2 instead. The first 8-bit
//     tensor moves the "dynamic" and "udynamic" maps (create_dynamic_map: 256 fp32 values
//     each) to the GPU, shared by every tensor. So a large tensor costs 2 + 8/256 = 2.03125 B
//     per element. optim_bits 32 (PagedAdamW): fp32 state1, state2.
//   Optimizer8bit.step: for each parameter, init_state (lazily) then update_step, one fused
//     kernel (optimizer_update_8bit_blockwise / optimizer_update_32bit) updating in place: no
//     temporaries (the fp32 gradient of a 16-bit parameter under master weights aside).
//   get_state_buffer with is_paged: tensors of at least 1e5 elements get F.get_paged buffers
//     (cudaMallocManaged): counted here as they occupy the GPU while resident, flagged as
//     evictable in the estimate's notes.
// Lion: lion-pytorch (lucidrains, lion_pytorch/lion_pytorch.py update_fn): state exp_avg =
//   torch.zeros_like(p); update = exp_avg.clone().mul_(β1).add(grad, alpha=1−β1).sign_() holds
//   the clone and the sum (two parameter-sized temporaries) for an instant, then the update
//   until the parameter is done; states created in the loop, one parameter at a time.
//   bnb.optim.Lion (fused here): Optimizer1State, fp32 state1, one kernel, no temporaries.
#include <string>

#include "gpumem/finetune.hpp"
#include "gpumem/format.hpp"
#include "gpumem/names.hpp"
#include "sim/trace_builder.hpp"

namespace gpumem {

StateTensors OptimizerStateTensors(const TrainingDef& training, const Regime& regime,
                                               const Tensor& parameter) {
  StateTensors states;
  auto push = [&states](const StateTensor& s) { states.items[states.count++] = s; };
  if (!parameter.trainable) return states;
  const std::int64_t n = parameter.Elements();
  // torch.zeros_like(p): a parameter kept in a dtype of its own (fp32 adapters) keeps its states
  // in that dtype (finetune.hpp StateTypeOf).
  const DType stateType = StateTypeOf(parameter, regime.states);
  // The parameter's shape converted once, not per state (called twice per parameter and
  // estimate: ComputeModelStates and CreateStates).
  const Shape parameterShape(parameter.shape);
  auto full = [&](const char* name, DType type) { push({name, n, type, parameterShape}); };
  switch (training.optimizer) {
    case OptimizerKind::SGD:
      break;
    case OptimizerKind::SGDMomentum:
      full("momentum_buffer", stateType);
      break;
    case OptimizerKind::Adam:
    case OptimizerKind::AdamW:
      full("exp_avg", stateType);
      full("exp_avg_sq", stateType);
      break;
    case OptimizerKind::Adam8bit:
    case OptimizerKind::AdamW8bit:
    case OptimizerKind::PagedAdamW8bit:
      if (n < kBnbMin8bitSize) {  // init_state: p.numel() < min_8bit_size → dtype = torch.float32
        full("state1", DType::FP32);
        full("state2", DType::FP32);
        break;
      }
      full("state1", DType::UInt8);
      full("state2", DType::UInt8);
      {
        const std::int64_t blocks = n / kBnbBlockSize + (n % kBnbBlockSize != 0 ? 1 : 0);
        push({"absmax1", blocks, DType::FP32, Shape{blocks}});
        push({"absmax2", blocks, DType::FP32, Shape{blocks}});
      }
      break;
    case OptimizerKind::PagedAdamW:  // optim_bits=32: fp32 whatever the parameter's dtype
      full("state1", DType::FP32);
      full("state2", DType::FP32);
      break;
    case OptimizerKind::Lion:
      if (training.optimizerImplementation == OptimizerImplementation::Fused) full("state1", DType::FP32);
      else full("exp_avg", regime.states);  // torch.zeros_like(p): the (master) parameter's dtype
      break;
    case OptimizerKind::Adafactor: {
      const auto& shape = parameter.shape;
      if (shape.size() >= 2) {
        std::vector<std::int64_t> rowShape(shape.begin(), shape.end() - 1);
        std::vector<std::int64_t> colShape(shape.begin(), shape.end() - 2);
        colShape.push_back(shape.back());
        std::int64_t rows = 1, cols = 1;
        for (auto d : rowShape) rows *= d;
        for (auto d : colShape) cols *= d;
        push({"exp_avg_sq_row", rows, DType::FP32, Shape(rowShape)});
        push({"exp_avg_sq_col", cols, DType::FP32, Shape(colShape)});
      } else {
        full("exp_avg_sq", DType::FP32);
      }
      if (training.adafactorBeta1) full("exp_avg", DType::FP32);
      break;
    }
  }
  return states;
}

namespace {
bool BitsAndBytes(OptimizerKind k) {
  return k == OptimizerKind::Adam8bit || k == OptimizerKind::AdamW8bit || k == OptimizerKind::PagedAdamW ||
         k == OptimizerKind::PagedAdamW8bit;
}
bool EightBit(OptimizerKind k) {
  return k == OptimizerKind::Adam8bit || k == OptimizerKind::AdamW8bit || k == OptimizerKind::PagedAdamW8bit;
}
// Optimizers whose loop creates a parameter's states right before its update (bitsandbytes'
// Optimizer8bit.step, lion-pytorch), not all states first (torch.optim's _init_group).
bool StatesInLoop(const TrainingDef& t) { return BitsAndBytes(t.optimizer) || t.optimizer == OptimizerKind::Lion; }
}  // namespace

StateTensors OptimizerSharedStates(const TrainingDef& training, const Inventory& inventory) {
  StateTensors shared;
  if (!EightBit(training.optimizer)) return shared;
  for (const Tensor& p : inventory.parameters) {
    if (!p.trainable || p.Elements() < kBnbMin8bitSize) continue;
    shared.items[shared.count++] = {"qmap1 (dynamic, shared)", kBnbQuantMapValues, DType::FP32, Shape{kBnbQuantMapValues}};
    shared.items[shared.count++] = {"qmap2 (udynamic, shared)", kBnbQuantMapValues, DType::FP32, Shape{kBnbQuantMapValues}};
    break;
  }
  return shared;
}

bool OptimizerStatesPaged(const TrainingDef& training, const Tensor& parameter) {
  const bool paged = training.optimizer == OptimizerKind::PagedAdamW || training.optimizer == OptimizerKind::PagedAdamW8bit;
  return paged && parameter.trainable && parameter.Elements() >= kBnbPagedMinElements;
}

OptimizerPass::OptimizerPass(const Setup& setup, const Inventory& inventory,
                             const std::vector<Text>& names, const Regime& regime)
    : setup_(setup), inventory_(inventory), names_(names), regime_(regime),
      created_(inventory.parameters.size(), false) {}

namespace {
// bitsandbytes' get_state_buffer: the state of the parameter's own size is paged, not absmax.
bool PagedBuffer(bool paged, const StateTensor& s, const Tensor& p) { return paged && s.elements == p.Elements(); }
}  // namespace

bool OptimizerPass::SharedMapsPending(const StateTensors& states) const {
  return !sharedCreated_ && states.count > 0 && states.items[0].type == DType::UInt8;
}

void OptimizerPass::CreateStates(TraceBuilder& b, std::size_t i) {
  if (created_[i]) return;
  created_[i] = true;
  const TrainingDef& t = setup_.training;
  const TextPart name = TextPart::View(LabelOf(t.optimizer));
  TextStore& text = b.text();
  const Tensor& p = inventory_.parameters[i];
  const StateTensors states = OptimizerStateTensors(t, regime_, p);
  if (SharedMapsPending(states)) {
    // init_state: self.name2qmap["dynamic"].to(p.device), before the tensor's own states.
    sharedCreated_ = true;
    for (const StateTensor& s : OptimizerSharedStates(t, inventory_)) {
      const TextPart state = TextPart::View(s.name);
      states_.push_back(b.Alloc(Category::OptimizerStates, s.elements * BytesPerElement(s.type), text.Make({state}),
                                text.Make({"step ", TextPart::Int(b.step()), ": ", name, " moves ", state, " to the GPU"}),
                                text.Shape(s.shape, s.type)));
    }
  }
  const bool paged = OptimizerStatesPaged(t, p);
  // "step N: AdamW creates " made once per step and referred to by every state's label (the
  // same words rendered): CreateStates 1,180 -> 1,080 instructions per parameter (callgrind,
  // Mixtral: two states each, ~1,000 parameters).
  if (createsStep_ != b.step()) {
    createsStep_ = b.step();
    // Step 0: DeepSpeed's initialize_optimizer_states at construction (parallel_step.hpp).
    creates_ = b.step() == 0 ? text.Make({"optimizer construction: ", name, " creates "})
                             : text.Make({"step ", TextPart::Int(b.step()), ": ", name, " creates "});
  }
  for (const StateTensor& s : states) {
    const TextPart state = TextPart::View(s.name);  // a literal
    if (PagedBuffer(paged, s, p)) {
      // F.get_paged: cuda_ptr = lib.cget_managed_ptr(num_bytes) (cudaMallocManaged), wrapped with
      // torch.frombuffer: no request to PyTorch's caching allocator, so no event. Kept to the end.
      b.UnifiedBytes(s.elements * BytesPerElement(s.type));
      continue;
    }
    states_.push_back(b.Alloc(Category::OptimizerStates, s.elements * BytesPerElement(s.type),
                              text.Make({names_[i], ".", state}),
                              text.Make({creates_, names_[i], ".", state}),
                              text.Shape(s.shape, s.type), p.layer));
  }
}

void OptimizerPass::Step(TraceBuilder& b) {
  std::vector<std::size_t> all;
  for (std::size_t i = 0; i < inventory_.parameters.size(); ++i) {
    if (inventory_.parameters[i].trainable) all.push_back(i);
  }
  StepTensors(b, all);
}

void OptimizerPass::StepTensors(TraceBuilder& b, const std::vector<std::size_t>& all) {
  if (StatesInLoop(setup_.training)) {
    // for p in params: init_state(p) (when new); update_step(p).
    for (std::size_t i : all) {
      CreateStates(b, i);
      Temporaries(b, {i});
    }
    return;
  }
  // Mixed precision with one foreach optimizer over the masters (validate.py optimizer_step):
  // every 16-bit gradient is upcast (grads32 = [p.grad.float() for p in params]) before
  // optimizer.step() creates the states, so the fp32 gradients come first.
  std::vector<TensorHandle> grads32 = UpcastGradients(b, all);
  for (std::size_t i : all) CreateStates(b, i);
  Temporaries(b, all, &grads32);
}

bool OptimizerPass::AdoptCopiedStep(TraceBuilder& b, std::size_t index, bool apply) {
  const Tensor& p = inventory_.parameters[index];
  if (!p.trainable || created_[index]) return true;  // a step of temporaries only: events
  const TrainingDef& t = setup_.training;
  const StateTensors states = OptimizerStateTensors(t, regime_, p);
  // CreateStates' one-time work (the quantization maps, the step's label) lies in a simulated
  // span before any copy; a copy cannot stand for it.
  if (SharedMapsPending(states) || createsStep_ != b.step()) return false;
  if (!apply) return true;
  created_[index] = true;
  const bool paged = OptimizerStatesPaged(t, p);
  for (const StateTensor& s : states) {
    if (PagedBuffer(paged, s, p)) b.UnifiedBytes(s.elements * BytesPerElement(s.type));
  }
  // (states_ keeps the handles CreateStates made; nothing reads it, and a copy's are the
  // copied events' own.)
  return true;
}

void OptimizerPass::StepParameter(TraceBuilder& b, std::size_t index) {
  if (!inventory_.parameters[index].trainable) return;
  CreateStates(b, index);
  Temporaries(b, {index});
}

OptimizerImplementation OptimizerPass::Implementation() const {
  const TrainingDef& t = setup_.training;
  // Adafactor, Lion and bitsandbytes loop over parameters whatever the setting says.
  if (t.optimizer == OptimizerKind::Adafactor || t.optimizer == OptimizerKind::Lion || BitsAndBytes(t.optimizer)) {
    return t.optimizerImplementation == OptimizerImplementation::Fused ? OptimizerImplementation::Fused
                                                                       : OptimizerImplementation::PerParameter;
  }
  return t.optimizerImplementation;
}

// A foreach list is one allocation per tensor, in order: p.grad.float() per parameter, and the
// foreach kernels (aten/src/ATen/native/cuda/ForeachUnaryOp.cu, via foreach_tensor_*_cuda) make
// their outputs with one at::empty_like per input tensor before launching. The allocator sees
// each parameter's own size, never one block of their sum: measured on an H100 (torch 2.11,
// tests/data/cuda), a single block of the sum could not reuse the freed activations' 512 MiB
// blocks and overstated reserved memory by 9 GiB for Llama 3.2 1B in bf16 with fp32 masters.
std::vector<TensorHandle> OptimizerPass::UpcastGradients(TraceBuilder& b, const std::vector<std::size_t>& indices) {
  std::vector<TensorHandle> grads32;
  if (Implementation() != OptimizerImplementation::ForEach || !regime_.masterWeights) return grads32;
  TextStore& text = b.text();
  const Text label = text.Make({TextPart::View(LabelOf(setup_.training.optimizer)), " step: foreach: gradients upcast to fp32"});
  for (std::size_t i : indices) {
    const Tensor& p = inventory_.parameters[i];
    if (!HasMasterCopy(p, true)) continue;  // the parameters kept in their own dtype (fp32 adapters)
    grads32.push_back(b.Alloc(Category::OptimizerIntermediates, p.Elements() * 4, text.Make({names_[i], ".grad (fp32)"}),
                              label, text.Shape(Shape(p.shape), DType::FP32), p.layer));
  }
  return grads32;
}

void OptimizerPass::Temporaries(TraceBuilder& b, const std::vector<std::size_t>& indices,
                                std::vector<TensorHandle>* upcastGrads) {
  const TrainingDef& t = setup_.training;
  const TextPart name = TextPart::View(LabelOf(t.optimizer));
  TextStore& text = b.text();

  const OptimizerImplementation impl = Implementation();
  if (t.optimizerImplementation == OptimizerImplementation::Fused) return;
  const bool adam = t.optimizer == OptimizerKind::Adam || t.optimizer == OptimizerKind::AdamW;
  const bool adafactor = t.optimizer == OptimizerKind::Adafactor;
  const bool lion = t.optimizer == OptimizerKind::Lion;
  const bool bnb = BitsAndBytes(t.optimizer);
  const bool upcast = regime_.masterWeights;
  if (bnb && !upcast) return;  // one in-place kernel per parameter
  const DType stateType = regime_.states;
  const Text step = text.Make({name, " step: "});
  auto temp = [&](std::int64_t bytes, Text tensor, Text what, Text formula, int layer = -1) {
    return b.Alloc(Category::OptimizerIntermediates, bytes, tensor, text.Make({step, what}), formula, layer);
  };

  if (impl == OptimizerImplementation::ForEach) {
    std::vector<TensorHandle> own;
    if (upcastGrads == nullptr) {
      own = UpcastGradients(b, indices);
      upcastGrads = &own;
    }
    if (adam) {
      // exp_avg_sq_sqrt = torch._foreach_sqrt(exp_avg_sqs), divided and ε-added in place, consumed
      // by _foreach_addcdiv_ (torch/optim/adam.py _multi_tensor_adam): one state-sized tensor
      // per parameter, all alive until the list is dropped.
      const Text label = text.Make({step, "foreach: _foreach_sqrt(exp_avg_sq)"});
      std::vector<TensorHandle> roots;
      roots.reserve(indices.size());
      for (std::size_t i : indices) {
        const Tensor& p = inventory_.parameters[i];
        const DType own = StateTypeOf(p, stateType);
        roots.push_back(b.Alloc(Category::OptimizerIntermediates, p.Elements() * BytesPerElement(own),
                                text.Make({"sqrt(", names_[i], ".exp_avg_sq)"}), label,
                                text.Shape(Shape(p.shape), own), p.layer));
      }
      const Text done = text.Make({step, "foreach addcdiv done"});
      for (TensorHandle h : roots) b.Release(h, done);
    }
    const Text freed = text.Make({step, "fp32 gradients freed"});
    for (TensorHandle h : *upcastGrads) b.Release(h, freed);
    return;
  }

  for (std::size_t i : indices) {
    const Tensor& p = inventory_.parameters[i];
    const Text pname = names_[i];
    const Shape shape(p.shape);
    const std::int64_t n = p.Elements();
    TensorHandle grad32 = kNoTensor, param32 = kNoTensor;
    if (HasMasterCopy(p, upcast) || (adafactor && GradientTypeOf(p, regime_.gradients) != DType::FP32)) {
      grad32 = temp(n * 4, text.Make({pname, ".grad (fp32)"}),
                    text.Make({"gradient of ", pname, " upcast to fp32"}), text.Shape(shape, DType::FP32), p.layer);
    }
    if (adafactor && !upcast && regime_.weights != DType::FP32) {
      param32 = temp(n * 4, text.Make({pname, " (fp32)"}), text.Make({"fp32 copy of ", pname}),
                     text.Shape(shape, DType::FP32), p.layer);
    }
    if (adam) {
      const DType own = StateTypeOf(p, stateType);
      const Text f = text.Shape(shape, own);
      TensorHandle root = temp(n * BytesPerElement(own), text.Make({"sqrt(exp_avg_sq)"}),
                               text.Make({"sqrt(exp_avg_sq) of ", pname}), f, p.layer);
      TensorHandle denom = temp(n * BytesPerElement(own), text.Make({"denom"}), text.Make({"denominator of ", pname}), f, p.layer);
      b.Release(root, text.Make({step, "sqrt consumed"}));
      b.Release(denom, text.Make({step, pname, " updated"}));
    } else if (lion) {
      // update = exp_avg.clone().mul_(β1).add(grad, alpha=1−β1).sign_()
      const DType own = StateTypeOf(p, stateType);
      const std::int64_t stateBytes = BytesPerElement(own);
      const Text f = text.Shape(shape, own);
      TensorHandle clone = temp(n * stateBytes, text.Make({"exp_avg.clone()"}),
                                text.Make({"exp_avg.clone() of ", pname}), f, p.layer);
      TensorHandle update = temp(n * stateBytes, text.Make({"update"}),
                                 text.Make({"update (clone · β1 + grad · (1 − β1)) of ", pname}), f, p.layer);
      b.Release(clone, text.Make({step, "clone consumed"}));
      b.Release(update, text.Make({step, pname, " updated"}));
    } else if (adafactor) {
      const Text f = text.Shape(shape, DType::FP32);
      TensorHandle square = temp(n * 4, text.Make({"grad²"}), text.Make({"grad² of ", pname}), f, p.layer);
      TensorHandle update = temp(n * 4, text.Make({"grad² + eps"}), text.Make({"grad² + ε of ", pname}), f, p.layer);
      b.Release(square, text.Make({step, "grad² consumed"}));
      TensorHandle scaled = temp(n * 4, text.Make({"update"}), text.Make({"factored update of ", pname}), f, p.layer);
      b.Release(update, text.Make({step, "grad² + ε consumed"}));
      TensorHandle negated = temp(n * 4, text.Make({"-update"}), text.Make({"−update applied to ", pname}), f, p.layer);
      b.Release(negated, text.Make({step, pname, " updated"}));
      b.Release(scaled, text.Make({step, "update freed"}));
    }
    b.Release(param32, text.Make({step, "fp32 copy written back"}));
    b.Release(grad32, text.Make({step, "fp32 gradient freed"}));
  }
}

}  // namespace gpumem
