"""Fine-tuning on the reference transformers of torch_reference.py, op by op as PEFT writes it
(peft is not installed here): frozen parameters, LoRA and DoRA wrappers of nn.Linear.

Followed (read, not copied):
  peft src/peft/tuners/lora/layer.py  Linear.forward (0.11 era): result = base_layer(x);
      x = x.to(lora_A.weight.dtype); LoRA: result + lora_B(lora_A(dropout(x))) * scaling;
      DoRA: x = dropout(x); result + lora_magnitude_vector(x, ...); result.to(result dtype).
  peft src/peft/tuners/lora/dora.py   DoraLinearLayer.forward (commit 0a6cd5a): lora_result,
      x_eye, lora_weight = lora_B(lora_A(x_eye)).T, the detached weight norm, the second
      F.linear(x, weight).
  peft LoraModel._mark_only_adapters_as_trainable: every base parameter frozen.
  transformers enable_input_require_grads: a forward hook on the input embeddings that makes
      their output require a gradient (with reentrant checkpointing and a PEFT model).
bitsandbytes cannot run on this CPU build: quantized weights are checked by exact byte tests
against its layouts in tests/finetune_test.cpp instead.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

DEFAULT_TARGETS = {"llama": ["q_proj", "v_proj"], "gpt2": ["c_attn"], "bert": ["query", "value"]}


class DoraLinearLayer(nn.Module):
    """The magnitude vector, initialised to the base weight's row norms."""

    def __init__(self, base, lora_A, lora_B, scaling, dtype):
        super().__init__()
        # update_layer (lora/dora.py at d20332e): lora_weight = lora_B @ lora_A, then get_weight_norm's
        # weight + scaling * lora_weight in the promoted dtype (bf16 + fp32 adapters: fp32) and
        # its row norms, which become the magnitude; the sum goes as get_weight_norm returns,
        # then lora_weight.
        with torch.no_grad():
            lora_weight = lora_B.weight @ lora_A.weight
            weight = base.weight + scaling * lora_weight
            norm = torch.linalg.norm(weight, dim=1).to(weight.dtype)
            del weight, lora_weight
        self.weight = nn.Parameter(norm, requires_grad=True)

    def forward(self, x, *, lora_A, lora_B, scaling, base_layer):
        lora_result = lora_B(lora_A(x))
        x_eye = torch.eye(lora_A.weight.shape[1], device=lora_A.weight.device, dtype=x.dtype)
        lora_weight = lora_B(lora_A(x_eye)).T
        magnitude = self.weight
        weight = base_layer.weight
        weight = weight.to(x.dtype)
        weight_norm = self.get_weight_norm(weight, lora_weight.detach(), scaling)
        weight_norm = weight_norm.detach()
        mag_norm_scale = (magnitude / weight_norm).view(1, -1)
        result_dora = (mag_norm_scale - 1) * (F.linear(x, weight)) + mag_norm_scale * lora_result * scaling
        return result_dora

    @staticmethod
    def get_weight_norm(weight, lora_weight, scaling):
        weight = weight + scaling * lora_weight
        return torch.linalg.norm(weight, dim=1).to(weight.dtype)


class LoraLinear(nn.Module):
    """peft.tuners.lora.layer.Linear around an nn.Linear (one adapter, "default")."""

    def __init__(self, base, r, alpha, p, use_dora, dtype, dropout_module):
        super().__init__()
        self.base_layer = base
        device = base.weight.device
        self.lora_A = nn.ModuleDict({"default": nn.Linear(base.in_features, r, bias=False, dtype=dtype, device=device)})
        self.lora_B = nn.ModuleDict({"default": nn.Linear(r, base.out_features, bias=False, dtype=dtype, device=device)})
        nn.init.zeros_(self.lora_B["default"].weight)
        self.lora_dropout = nn.ModuleDict({"default": dropout_module(p) if p > 0 else nn.Identity()})
        self.scaling = alpha / r
        self.use_dora = use_dora
        if use_dora:
            self.lora_magnitude_vector = nn.ModuleDict({"default": DoraLinearLayer(
                base, self.lora_A["default"], self.lora_B["default"], self.scaling, dtype)})

    def forward(self, x):
        result = self.base_layer(x)
        torch_result_dtype = result.dtype
        lora_A, lora_B = self.lora_A["default"], self.lora_B["default"]
        dropout = self.lora_dropout["default"]
        x = x.to(lora_A.weight.dtype)
        if not self.use_dora:
            result = result + lora_B(lora_A(dropout(x))) * self.scaling
        else:
            x = dropout(x)
            result = result + self.lora_magnitude_vector["default"](
                x, lora_A=lora_A, lora_B=lora_B, scaling=self.scaling, base_layer=self.base_layer)
        result = result.to(torch_result_dtype)
        return result


def _target(name, targets):
    for t in targets:
        if t == "all-linear":
            if name.split(".")[-1] not in ("lm_head", "classifier"):
                return True
        elif name == t or name.endswith("." + t):
            return True
    return False


def _is_embedding(name):
    return "embed_tokens" in name or name.startswith("transformer.wte") or name.startswith("transformer.wpe") \
        or "embeddings." in name


def _is_head(name):
    return name.startswith(("lm_head.", "classifier.", "bert.pooler.", "cls."))


def _block_of(name):
    parts = name.split(".")
    for i, part in enumerate(parts[:-1]):
        if part in ("layers", "h", "layer") and parts[i + 1].isdigit():
            return int(parts[i + 1])
    return -1


def apply(model, setup, param_dtype, dropout_module):
    """Freezes and wraps `model` in place as setup["finetune"] says; returns whether the
    embeddings' output must require a gradient (enable_input_require_grads)."""
    f = setup.get("finetune") or {}
    if not f:
        return False
    family = setup["model"]["architecture"]["family"]
    for name, p in model.named_parameters():
        frozen = (f.get("freezeEmbeddings") and _is_embedding(name)) or \
                 (f.get("freezeHead") and _is_head(name)) or \
                 (0 <= _block_of(name) < f.get("freezeFirstBlocks", 0))
        only = f.get("trainOnlyModules") or []
        if only and not any(("." + m + ".") in ("." + name) for m in only):
            frozen = True
        if f.get("lora"):
            frozen = True  # _mark_only_adapters_as_trainable
        if frozen:
            p.requires_grad_(False)
    if not f.get("lora"):
        return False
    targets = f.get("targetModules") or DEFAULT_TARGETS[family]
    adapter_dtype = torch.float32 if f.get("adapterDType", "fp32") == "fp32" else param_dtype
    wrapped = []
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and _target(name, targets):
            wrapped.append(name)
    for name in wrapped:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        base = getattr(parent, child)
        setattr(parent, child, LoraLinear(base, f.get("r", 8), f.get("loraAlpha", 8), f.get("loraDropout", 0.0),
                                          f.get("useDora", False), adapter_dtype, dropout_module))
    # PEFT and TRL add the hook for reentrant checkpointing only ("When having
    # `use_reentrant=False` + gradient_checkpointing, there is no need for this hack").
    t = setup["training"]
    return t.get("checkpointing", "none") != "none" and t.get("useReentrant", True)


def hook_input_grads(model, family, on_leaf=None):
    """transformers PreTrainedModel.enable_input_require_grads on the input embeddings.
    `on_leaf(output)` sees each leaf it makes (its AccumulateGrad node, and so the graph, holds
    it until the loss goes)."""
    emb = {"llama": lambda m: m.model.embed_tokens, "gpt2": lambda m: m.transformer.wte,
           "bert": lambda m: m.bert.embeddings.word_embeddings}[family](model)

    def make_inputs_require_grads(module, inputs, output):
        output.requires_grad_(True)
        if on_leaf is not None:
            on_leaf(output)

    return emb.register_forward_hook(make_inputs_require_grads)
