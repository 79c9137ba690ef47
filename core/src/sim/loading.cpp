// Loading a quantized model on one GPU: the loaders' allocations and frees, per weight, in load
// order (loading.hpp lists the sources). A quantized weight's stored form is one Parameters block
// (StoredBytes), born with its largest part (the packed codes); its small kept parts (absmax,
// code table, scalers) are inside that block, so the parameters' bytes stay exactly those of
// the plain init and only the transients (Category::WeightCopies) are new.
#include "sim/loading.hpp"

#include <algorithm>

#include "gpumem/finetune.hpp"
#include "sim/tape.hpp"

namespace gpumem {

bool LoadingSimulated(const Setup& setup) {
  const FinetuneDef& f = setup.finetune;
  return setup.model.kind == ModelKind::Transformer &&
         (f.quantization != Quantization::None || f.prepareForKbitTraining || (f.lora && f.useDora));
}

namespace {

class Loader {
 public:
  Loader(TraceBuilder& b, const Inventory& inventory, const std::vector<Text>& names, DType weights)
      : b_(b), t_(b.text()), inventory_(inventory), names_(names), weights_(weights),
        w_(BytesPerElement(weights)) {}

  // The parameter's stored form (what the plain init allocates for it).
  TensorHandle Stored(std::size_t i, Text label) {
    const Tensor& p = inventory_.parameters[i];
    return b_.Alloc(Category::Parameters, StoredBytes(p, weights_), names_[i], label,
                    StorageFormula(t_, p, weights_), p.layer);
  }
  TensorHandle Temp(std::size_t i, std::int64_t bytes, Text what, Text formula) {
    const Tensor& p = inventory_.parameters[i];
    return b_.Alloc(Category::WeightCopies, bytes, t_.Make({names_[i], " ", what}),
                    t_.Make({"loading: ", step_, " of ", names_[i], " (", what, ")"}), formula, p.layer);
  }
  void Drop(TensorHandle h, std::size_t i, Text what) {
    b_.Release(h, t_.Make({"loading: ", step_, " of ", names_[i], " frees ", what}));
  }
  Text Elems(std::int64_t n, const char* type) { return t_.Make({TextPart::Count(n), " × ", TextPart::View(type)}); }

  // bitsandbytes Params4bit._quantize (nn/modules.py): w = self.data.contiguous().to(device), the
  // checkpoint-dtype copy on the GPU; functional.quantize_4bit(w): the CUDA op allocates absmax
  // fp32 [⌈n/64⌉] then out [(n+1)/2 · …] (backends/cuda/ops.py); get_4bit_type(device) the
  // 16-entry code. With compress_statistics: offset = _absmax.mean(); quantize_blockwise(
  // _absmax − offset, blocksize=256) (a temporary fp32 [⌈n/64⌉], freed when the call returns;
  // its outputs, the uint8 absmax and the nested fp32 absmax, are kept); then `del _absmax`.
  // self.data = w_4bit, and w, a local, is freed when _quantize returns.
  void Bnb4Bit(std::size_t i) {
    const Tensor& p = inventory_.parameters[i];
    step_ = t_.Make({"quantize_4bit"});
    const std::int64_t n = p.Elements(), blocks = (n + kBnb4BitBlockSize - 1) / kBnb4BitBlockSize;
    const bool doubleQuant = p.storage == Tensor::Storage::NF4Double;
    const TensorHandle copy = Temp(i, n * w_, t_.Make({TextPart::View(DTypeId(weights_)), " copy"}),
                                   t_.Shape(Shape(p.shape), weights_));
    // Without double quant the fp32 absmax is kept: it is part of the stored block.
    const TensorHandle absmax = doubleQuant ? Temp(i, blocks * 4, t_.Make({"fp32 absmax"}), Elems(blocks, "4 B")) : kNoTensor;
    Stored(i, t_.Make({"loading: quantize_4bit of ", names_[i], " (packed 4-bit codes and statistics)"}));
    if (doubleQuant) {
      const TensorHandle centred = Temp(i, blocks * 4, t_.Make({"absmax − offset"}), Elems(blocks, "4 B"));
      Drop(centred, i, t_.Make({"absmax − offset (quantize_blockwise returned)"}));
      Drop(absmax, i, t_.Make({"fp32 absmax (del _absmax)"}));
    }
    Drop(copy, i, t_.Make({TextPart::View(DTypeId(weights_)), " copy (Params4bit._quantize returned)"}));
  }

  // bitsandbytes Int8Params._quantize: B = self.data.contiguous().to(device, dtype=torch.float16);
  // int8_vectorwise_quant(B) (threshold 0: no outlier columns) allocates row_stats fp32 [rows]
  // and out_row int8 [rows, cols], kept as SCB and CB; B is freed when _quantize returns.
  void Int8(std::size_t i) {
    const Tensor& p = inventory_.parameters[i];
    step_ = t_.Make({"int8_vectorwise_quant"});
    const TensorHandle copy = Temp(i, p.Elements() * 2, t_.Make({"fp16 copy"}), t_.Shape(Shape(p.shape), DType::FP16));
    Stored(i, t_.Make({"loading: int8_vectorwise_quant of ", names_[i], " (int8 CB and fp32 SCB)"}));
    Drop(copy, i, t_.Make({"fp16 copy (Int8Params._quantize returned)"}));
  }

  // torchao NF4Tensor.from_tensor(x) for a weight of n values of w bytes (B = n/64 blocks,
  // F = n/16,384 scaler blocks). `keep` says whether the result is the parameter (its stored
  // block) or a second NF4Tensor that load_state_dict copies in and drops (returned).
  TensorHandle FromTensor(std::size_t i, bool keep, std::int64_t chunk) {
    const Tensor& p = inventory_.parameters[i];
    const std::int64_t n = p.Elements(), blocks = n / kTorchaoNf4BlockSize;
    const DType wt = weights_;
    auto temp = [&](std::int64_t elements, std::int64_t bytesEach, const char* what) {
      return Temp(i, elements * bytesEach, t_.Make({TextPart::View(what)}),
                  t_.Make({TextPart::Count(elements), " × ", TextPart::Int(bytesEach), " B"}));
    };
    // get_block_absmax(x, size): blocks.abs() [n] → .max(dim=1): values [n/size] and int64
    // indices; abs is freed as max returns, the indices as the namedtuple is dropped.
    auto blockAbsmax = [&](std::int64_t elements, std::int64_t size, const char* what) {
      const TensorHandle abs = temp(elements, w_, "get_block_absmax abs");
      const TensorHandle values = temp(elements / size, w_, what);
      const TensorHandle indices = temp(elements / size, 8, "get_block_absmax max indices (int64)");
      Drop(abs, i, t_.Make({"get_block_absmax abs"}));
      Drop(indices, i, t_.Make({"get_block_absmax max indices"}));
      return values;
    };
    // double_quantize_scalers(x.flatten()):
    const TensorHandle scalers1 = blockAbsmax(n, kTorchaoNf4BlockSize, "scalers_1 (absmax per 64)");
    const TensorHandle centred = temp(blocks, w_, "scalers_1 − mean");  // scalers_1 = scalers_1 - scalers_1_mean
    Drop(scalers1, i, t_.Make({"scalers_1 (rebound)"}));
    const TensorHandle scalerAbsmax = blockAbsmax(blocks, kTorchaoNf4ScalerBlockSize, "scaler_absmax (per 256)");
    // quantization_factor = 256 / (2 * scaler_absmax.unsqueeze(-1).expand(F, 256)): each op on
    // the expanded view materializes F × 256 = B values ("realizes n_scaler entries"), and
    // `256 / t` is Tensor.__rtruediv__ (torch/_tensor.py): t.reciprocal() * 256.
    const TensorHandle twice = temp(blocks, w_, "2 · scaler_absmax (expanded)");
    const TensorHandle reciprocal = temp(blocks, w_, "reciprocal (256 / t)");
    const TensorHandle factorFull = temp(blocks, w_, "quantization_factor (expanded)");
    Drop(reciprocal, i, t_.Make({"reciprocal"}));
    Drop(twice, i, t_.Make({"2 · scaler_absmax"}));
    const TensorHandle scaled = temp(blocks, w_, "scaler_blocks · quantization_factor");
    const TensorHandle rounded = temp(blocks, w_, ".round()");
    Drop(scaled, i, t_.Make({"scaler_blocks · quantization_factor"}));
    const TensorHandle clamped = temp(blocks, w_, ".clamp(-128, 127)");
    Drop(rounded, i, t_.Make({".round()"}));
    // Returned: .flatten().to(torch.int8) [B] and quantization_factor[:, 0]...contiguous() [F]
    // (kept, inside the stored block); the locals are freed as the function returns.
    Drop(clamped, i, t_.Make({".clamp() (after .to(int8))"}));
    Drop(scalerAbsmax, i, t_.Make({"scaler_absmax"}));
    Drop(centred, i, t_.Make({"scalers_1 − mean"}));
    Drop(factorFull, i, t_.Make({"expanded quantization_factor (contiguous() copied it)"}));
    // convert_to_norm_float_weight(x, B, 64, nf4):
    const TensorHandle scalers = blockAbsmax(n, kTorchaoNf4BlockSize, "scalers (absmax per 64)");
    const TensorHandle scaledBlocks = temp(n, w_, "scaled_blocks = blocks / scales");
    TensorHandle out = kNoTensor;
    auto keepOrTemp = [&]() {
      return keep ? Stored(i, t_.Make({"loading: to_nf4 of ", names_[i], " (NF4Tensor: quantized_data, scalers, factors, table)"}))
                  : Temp(i, StoredBytes(p, wt), t_.Make({"second NF4Tensor"}), StorageFormula(t_, p, wt));
    };
    // quantize_tensor_nearest(v, nf4) on c values: (v.unsqueeze(-1) − nf4) [c, 16], .abs()
    // [c, 16] (the difference freed as abs returns), diff.min(dim=-1): values [c] (dropped with
    // the namedtuple) and int64 indices [c] (returned); diff is freed on return.
    auto nearest = [&](std::int64_t c) {
      const TensorHandle difference = temp(c * kTorchaoNf4TableEntries, w_, "quantize_tensor_nearest value − nf4 [c, 16]");
      const TensorHandle absDiff = temp(c * kTorchaoNf4TableEntries, w_, "quantize_tensor_nearest |value − nf4| [c, 16]");
      Drop(difference, i, t_.Make({"value − nf4"}));
      const TensorHandle values = temp(c, w_, "quantize_tensor_nearest min values");
      const TensorHandle indices = temp(c, 8, "quantize_tensor_nearest indices (int64)");
      Drop(values, i, t_.Make({"min values"}));
      Drop(absDiff, i, t_.Make({"|value − nf4|"}));
      return indices;
    };
    if (chunk <= 0) {
      // torchao before #196: the whole weight at once; quantized_blocks are the int64 indices.
      // quantized_blocks[::2] << 4 [n/2 int64], | quantized_blocks[1::2] [n/2 int64], .to(uint8).
      const TensorHandle indices = nearest(n);
      const TensorHandle shifted = temp(n / 2, 8, "quantized_blocks[::2] << 4 (int64)");
      const TensorHandle combined = temp(n / 2, 8, "combined_blocks (int64)");
      Drop(shifted, i, t_.Make({"quantized_blocks[::2] << 4"}));
      out = keepOrTemp();
      Drop(scalers, i, t_.Make({"scalers"}));
      Drop(scaledBlocks, i, t_.Make({"scaled_blocks"}));
      Drop(indices, i, t_.Make({"quantized_blocks (int64 indices)"}));
      Drop(combined, i, t_.Make({"combined_blocks (int64)"}));
    } else {
      // Since #196: quantized_blocks = torch.empty(n, uint8), filled chunk by chunk with
      // quantize_tensor_nearest(...).to(torch.uint8); then [::2] << 4 and | in uint8 (the .to()
      // of a uint8 tensor returns it).
      // Only the first chunk and a shorter last one are written out: a chunk allocates and frees
      // the same sizes in the same order, so after the first the allocator finds every block
      // it needs cached and ends as it began; the other full chunks change no total, no peak and
      // no segment (and a 70B weight has hundreds of them).
      const TensorHandle codes = temp(n, 1, "quantized_blocks (uint8)");
      const std::int64_t chunks = (n + chunk - 1) / chunk;
      for (std::int64_t k = 0; k < chunks; ++k) {
        const std::int64_t c = std::min(chunk, n - k * chunk);
        if (k > 0 && (k < chunks - 1 || c == chunk)) continue;
        const TensorHandle indices = nearest(c);
        const TensorHandle narrowed = temp(c, 1, "chunk .to(uint8)");
        Drop(indices, i, t_.Make({"chunk indices"}));
        Drop(narrowed, i, t_.Make({"chunk ", TextPart::Int(k + 1), " of ", TextPart::Int(chunks),
                                   " .to(uint8), copied into quantized_blocks (full chunks repeat these events)"}));
      }
      const TensorHandle shifted = temp(n / 2, 1, "quantized_blocks[::2] << 4");
      out = keepOrTemp();
      Drop(shifted, i, t_.Make({"quantized_blocks[::2] << 4"}));
      Drop(scalers, i, t_.Make({"scalers"}));
      Drop(codes, i, t_.Make({"quantized_blocks"}));
      Drop(scaledBlocks, i, t_.Make({"scaled_blocks"}));
    }
    return out;
  }

  // torchtune LoRALinear(quantize_base=True)._create_weight_and_bias, built under the recipe's
  // `with set_default_dtype(dtype), device:`: nn.Linear(in, out) makes the weight on the GPU in
  // the model's dtype, to_nf4(linear.weight) quantizes it, and the nn.Linear is dropped.
  void TorchaoConstruct(std::size_t i, std::int64_t chunk) {
    const Tensor& p = inventory_.parameters[i];
    step_ = t_.Make({"to_nf4 at construction"});
    const TensorHandle linear = Temp(i, p.Elements() * w_, t_.Make({"nn.Linear weight"}), t_.Shape(Shape(p.shape), weights_));
    FromTensor(i, true, chunk);
    Drop(linear, i, t_.Make({"nn.Linear weight (dropped after to_nf4)"}));
  }
  // model.load_state_dict(base_model_state_dict): NF4Tensor copy_ (torchao nf4 copy_): a plain
  // tensor is moved to the device (copy_in.to(original.device)), quantized by from_tensor and
  // copied into the parameter's inner tensors in place; the copy and the new NF4Tensor are dropped.
  void TorchaoLoad(std::size_t i, std::int64_t chunk) {
    const Tensor& p = inventory_.parameters[i];
    step_ = t_.Make({"load_state_dict copy_ into NF4Tensor"});
    const TensorHandle copy = Temp(i, p.Elements() * w_, t_.Make({TextPart::View(DTypeId(weights_)), " checkpoint copy"}),
                                   t_.Shape(Shape(p.shape), weights_));
    const TensorHandle second = FromTensor(i, false, chunk);
    Drop(second, i, t_.Make({"second NF4Tensor (copied in place)"}));
    Drop(copy, i, t_.Make({"checkpoint copy"}));
  }

  // PEFT's dora_init → DoraLinearLayer.update_layer (tuners/lora/dora.py at d20332e; PEFT 0.10's
  // 0a6cd5a had delayed it to the first forward, later versions run it here), for each adapted
  // linear once its lora_A and lora_B are on the base layer's device (LoraLayer.update_layer:
  // "call this before dora_init"). `magnitude` is the magnitude parameter's index, `base` the base
  // weight's, `a` lora_A's. In order:
  //   - a Linear4bit base is deep-copied ("otherwise, FSDP will throw an error"; its packed
  //     codes and quant state, one block here) and dequantize_module_weight dequantizes it to
  //     the dtype it was loaded in; an int8 one is weight.data · SCB · (1/127), fp32, one
  //     temporary on the way; a float base weight is read as it is;
  //   - fp16 adapters are upcast (lora_A.float(), lora_B.float()) and lora_weight made in fp32
  //     and then .half();
  //   - lora_weight = lora_B @ lora_A [out, in] in the adapters' dtype;
  //   - get_weight_norm: weight + scaling * lora_weight (the scaled product freed after the add;
  //     the sum in the promoted dtype), torch.linalg.norm(weight, dim=1) [out], which becomes
  //     the magnitude parameter, and the sum freed as the function returns;
  //   - update_layer's locals freed as it returns, in argument-then-local order: the copied
  //     base layer, the upcast adapters, the dequantized weight, lora_weight.
  // Measured on CPU torch (validate's llama-dora-qv, fp32): each adapted layer's init peaks at
  // three [out, in] fp32 tensors above what is loaded.
  void DoraInit(std::size_t magnitude, std::size_t base, std::size_t a) {
    const Tensor& w = inventory_.parameters[base];
    const Tensor& m = inventory_.parameters[magnitude];
    step_ = t_.Make({"dora_init"});
    const std::int64_t n = w.Elements();
    const Shape shape{m.shape[0], n / std::max<std::int64_t>(1, m.shape[0])};
    const DType adapters = inventory_.parameters[a].storage == Tensor::Storage::FP32 ? DType::FP32 : weights_;
    auto temp = [&](std::int64_t elements, DType type, const char* what, const Shape& sh) {
      return Temp(magnitude, elements * BytesPerElement(type), t_.Make({TextPart::View(what)}), t_.Shape(sh, type));
    };
    TensorHandle copy = kNoTensor, dequantized = kNoTensor, upA = kNoTensor, upB = kNoTensor;
    DType weightType = ParameterType(w, weights_, weights_);
    if (w.storage == Tensor::Storage::NF4 || w.storage == Tensor::Storage::NF4Double) {
      copy = Temp(magnitude, StoredBytes(w, weights_), t_.Make({"deepcopy(base_layer)"}), StorageFormula(t_, w, weights_));
      weightType = weights_;
      dequantized = temp(n, weightType, "dequantized base weight", shape);
    } else if (w.storage == Tensor::Storage::Int8) {
      weightType = DType::FP32;
      const TensorHandle scaled = temp(n, DType::FP32, "weight.data · SCB", shape);
      dequantized = temp(n, DType::FP32, "dequantized base weight (· 1/127)", shape);
      Drop(scaled, magnitude, t_.Make({"weight.data · SCB"}));
    }
    TensorHandle product = kNoTensor;
    if (adapters == DType::FP16) {
      const Tensor& pa = inventory_.parameters[a];
      const Tensor& pb = inventory_.parameters[a + 1];
      upA = temp(pa.Elements(), DType::FP32, "lora_A.float()", Shape(pa.shape));
      upB = temp(pb.Elements(), DType::FP32, "lora_B.float()", Shape(pb.shape));
      const TensorHandle wide = temp(n, DType::FP32, "lora_B @ lora_A (fp32)", shape);
      product = temp(n, DType::FP16, "lora_weight.half()", shape);
      Drop(wide, magnitude, t_.Make({"lora_B @ lora_A (fp32, rebound)"}));
    } else {
      product = temp(n, adapters, "lora_weight = lora_B @ lora_A", shape);
    }
    const DType productType = adapters == DType::FP16 ? DType::FP16 : adapters;
    const TensorHandle scaled = temp(n, productType, "scaling * lora_weight", shape);
    const TensorHandle sum = temp(n, Promote(weightType, productType), "weight + scaling * lora_weight", shape);
    Drop(scaled, magnitude, t_.Make({"scaling * lora_weight"}));
    Stored(magnitude, t_.Make({"loading: dora_init of ", names_[magnitude], " (torch.linalg.norm(weight, dim=1))"}));
    Drop(sum, magnitude, t_.Make({"weight + scaling * lora_weight (get_weight_norm returned)"}));
    for (TensorHandle h : {copy, upA, upB, dequantized, product}) {
      if (h != kNoTensor) Drop(h, magnitude, t_.Make({"its temporaries (update_layer returned)"}));
    }
  }

  // prepare_model_for_kbit_training: param.data = param.data.to(torch.float32) for each fp16 /
  // bf16 parameter but Params4bit: the fp32 tensor is made while the 16-bit one lives; the old
  // data is freed when param.data is rebound.
  void Upcast(std::size_t i, TensorHandle sixteenBit) {
    step_ = t_.Make({"prepare_model_for_kbit_training"});
    Stored(i, t_.Make({"loading: prepare_model_for_kbit_training: fp32 copy of ", names_[i]}));
    Drop(sixteenBit, i, t_.Make({TextPart::View(DTypeId(weights_)), " data (param.data rebound to fp32)"}));
  }
  TensorHandle SixteenBit(std::size_t i) {
    const Tensor& p = inventory_.parameters[i];
    step_ = t_.Make({"from_pretrained"});
    return b_.Alloc(Category::WeightCopies, p.Elements() * w_, t_.Make({names_[i], " (", TextPart::View(DTypeId(weights_)), ")"}),
                    t_.Make({"loading: from_pretrained places ", names_[i], " in ", TextPart::View(DTypeId(weights_))}),
                    t_.Shape(Shape(p.shape), weights_), p.layer);
  }

 private:
  TraceBuilder& b_;
  TextStore& t_;
  const Inventory& inventory_;
  const std::vector<Text>& names_;
  DType weights_;
  std::int64_t w_;
  Text step_{};
};

}  // namespace

void AllocParametersAsLoaded(TraceBuilder& b, const Setup& setup, const Inventory& inventory,
                             const std::vector<Text>& names, DType regimeWeights, std::int64_t torchaoChunk) {
  const FinetuneDef& f = setup.finetune;
  const std::vector<Tensor>& params = inventory.parameters;
  TextStore& t = b.text();
  Loader load(b, inventory, names, regimeWeights);
  auto plain = [&](std::size_t i) {
    const Tensor& p = params[i];
    b.Alloc(Category::Parameters, StoredBytes(p, regimeWeights), names[i], t.Make({"model init: ", names[i]}),
            StorageFormula(t, p, regimeWeights), p.layer);
  };

  if (f.quantLayout == QuantLayout::TorchaoNf4 && f.quantization != Quantization::None) {
    // torchtune's recipe: the model is built on the GPU in module order (the inventory's order:
    // each LoRALinear quantizes its base weight, then makes lora_a and lora_b), then
    // load_state_dict copies the checkpoint in, state-dict (module) order; a plain bf16
    // parameter's copy_ from the CPU writes in place (no GPU temporary).
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (params[i].storage == Tensor::Storage::TorchaoNF4) load.TorchaoConstruct(i, torchaoChunk);
      else plain(i);
    }
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (params[i].storage == Tensor::Storage::TorchaoNF4) load.TorchaoLoad(i, torchaoChunk);
    }
    return;
  }

  // transformers from_pretrained (bitsandbytes quantizer), tensor by tensor in module order;
  // then prepare_model_for_kbit_training's casts; then get_peft_model's adapters, which PEFT
  // makes after the model is loaded and moves to the base layer's device.
  const bool sixteenBit = regimeWeights != DType::FP32;
  std::vector<TensorHandle> toUpcast(params.size(), kNoTensor);
  for (std::size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    if (p.adapter) continue;
    if (p.storage == Tensor::Storage::NF4 || p.storage == Tensor::Storage::NF4Double) load.Bnb4Bit(i);
    else if (p.storage == Tensor::Storage::Int8) load.Int8(i);
    else if (f.prepareForKbitTraining && sixteenBit && p.storage == Tensor::Storage::FP32) toUpcast[i] = load.SixteenBit(i);
    else plain(i);
  }
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (toUpcast[i] != kNoTensor) load.Upcast(i, toUpcast[i]);
  }
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (!params[i].adapter) continue;
    // The inventory lists an adapted linear's base weight, lora_A, lora_B, then DoRA's magnitude.
    const bool dora = f.useDora && i >= 3 && params[i].name.ends_with(".lora_magnitude_vector.default.weight") &&
                      params[i - 3].name.ends_with(".base_layer.weight");
    if (dora) load.DoraInit(i, i - 3, i - 2);
    else plain(i);
  }
}

}  // namespace gpumem
