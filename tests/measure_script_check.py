#!/usr/bin/env python3
"""Runs a measuring script (gpumem --measure-script) against the stand-ins of tests/measure_fakes
(no GPU, no PyTorch needed) and checks that it did what its setup says: the model type and dtype,
attention, checkpointing, LoRA, optimizer, precision's autocast and scaler, accumulation, the
allocator's environment, and a report holding gpumem's figures.
Usage: measure_script_check.py SCRIPT LOG"""
import json
import os
import runpy
import subprocess
import sys

script, log = sys.argv[1], sys.argv[2]
fakes = os.path.join(os.path.dirname(os.path.abspath(__file__)), "measure_fakes")
if os.path.exists(log):
    os.remove(log)
env = {**os.environ, "PYTHONPATH": fakes, "MEASURE_FAKES_LOG": log}
run = subprocess.run([sys.executable, script, "--json"], env=env, capture_output=True, text=True, check=True)
report = json.loads(run.stdout)
calls = [json.loads(line) for line in open(log)]
script_globals = runpy.run_path(script, run_name="measure_script_check")
setup, predicted = script_globals["SETUP"], script_globals["PREDICTED"]
t, f = setup["training"], setup["finetune"]


def only(name):
    found = [c for c in calls if c["call"] == name]
    assert len(found) == 1, f"{name}: {len(found)} calls"
    return found[0]


def count(name):
    return sum(1 for c in calls if c["call"] == name)


precision = t["precision"]
dtype = {"fp32": "float32", "bf16": "bfloat16", "bf16Mixed": "bfloat16", "fp16Mixed": "float16",
         "ampBf16": "float32", "ampFp16": "float32"}[precision]
if f["quantization"] == "none":
    made = only("from_config")
else:
    # A random checkpoint on the CPU, then from_pretrained with bitsandbytes onto GPU 0.
    assert only("from_config")["attn_implementation"] is None and count("save_pretrained") == 1
    made = only("from_pretrained")
    assert made["quantized"] and made["device_map"] == {"": 0}, made
    bnb = only("BitsAndBytesConfig")
    if f["quantization"] == "int8":
        assert bnb == {"call": "BitsAndBytesConfig", "load_in_8bit": True}, bnb
    else:
        storage = {"uint8": "uint8", "bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[f["quantStorage"]]
        compute = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[f["computeDType"]]
        assert (bnb["load_in_4bit"], bnb["bnb_4bit_quant_type"], bnb["bnb_4bit_use_double_quant"],
                bnb["bnb_4bit_compute_dtype"], bnb["bnb_4bit_quant_storage"]) == (
                    True, f["quantization"], f["doubleQuant"], compute, storage), bnb
assert made["dtype"] == dtype and made["attn_implementation"] == t["attention"], made
assert only("config")["fields"]["use_cache"] == t["useCache"]
accumulation = max(1, setup["parallel"]["gradientAccumulationSteps"])
assert count("forward") == count("backward") == 2 * accumulation
amp = [c for c in calls if c["call"] == "autocast"]
assert all(c["enabled"] == precision.startswith("amp") for c in amp)
assert all(c["dtype"] == ("float16" if precision == "ampFp16" else "bfloat16") for c in amp)
assert count("GradScaler") == (1 if precision == "ampFp16" else 0)
if f["prepareForKbitTraining"]:
    # peft's preparation checkpoints every block itself (and hooks the embeddings' output).
    prepared = only("prepare_model_for_kbit_training")
    assert prepared["use_gradient_checkpointing"] and prepared["kwargs"] == {"use_reentrant": t["useReentrant"]}
    assert count("gradient_checkpointing_enable") == 0
elif t["checkpointing"] == "everyBlock":
    assert only("gradient_checkpointing_enable")["kwargs"] == {"use_reentrant": t["useReentrant"]}
else:
    assert count("gradient_checkpointing_enable") == 0
if f["lora"]:
    lc = only("LoraConfig")
    assert (lc["r"], lc["lora_alpha"], lc["lora_dropout"], lc["use_dora"]) == (f["r"], f["loraAlpha"], f["loraDropout"], f["useDora"])
    assert only("get_peft_model")["autocast_adapter_dtype"] == (f["adapterDType"] == "fp32")
    wants_hook = t["checkpointing"] == "everyBlock" and t["useReentrant"] and not f["prepareForKbitTraining"]
    assert count("enable_input_require_grads") == (1 if wants_hook else 0)
else:
    assert count("get_peft_model") == 0
optimizers = [c for c in calls if c["call"] == "optimizer"]
names = {"sgd": "SGD", "sgdMomentum": "SGD", "adam": "Adam", "adamw": "AdamW", "adafactor": "Adafactor",
         "adam8bit": "Adam8bit", "adamw8bit": "AdamW8bit", "pagedAdamw": "PagedAdamW", "pagedAdamw8bit": "PagedAdamW8bit"}
assert optimizers and all(o["cls"] == names[t["optimizer"]] for o in optimizers), optimizers
if t["optimizer"] in ("sgd", "sgdMomentum", "adam", "adamw"):
    impl = t["optimizerImplementation"]
    flag = {"fused": ("fused", True), "perParameter": ("foreach", False), "forEach": ("foreach", True)}[impl]
    assert all(o.get(flag[0]) == flag[1] for o in optimizers), optimizers
    assert all(o.get("momentum", 0) == (0.9 if t["optimizer"] == "sgdMomentum" else 0) for o in optimizers)
mixed = precision.endswith("Mixed")
per_tensor = (mixed and t["optimizerImplementation"] == "perParameter") or t["optimizerInBackward"]
assert (len(optimizers) > 1 or optimizers[0]["tensors"] == 1) if per_tensor else len(optimizers) == 1
assert count("post_accumulate_grad_hook") == (len(optimizers) if t["optimizerInBackward"] else 0)
every = t["emptyCacheSteps"]
assert count("empty_cache") == sum(accumulation for step in (1, 2) if every and (step - 1) % every == 0)
assert all(c["set_to_none"] == t["zeroGradSetToNone"] for c in calls if c["call"] == "zero_grad")
allocator = setup["runtime"]["allocator"]
environment = only("environment")
assert (environment["PYTORCH_CUDA_ALLOC_CONF"] or "").startswith("expandable_segments:True") == allocator["expandableSegments"]
assert environment["CUDA_MODULE_LOADING"] == ("LAZY" if setup["runtime"]["lazyModuleLoading"] else "EAGER")
assert environment["CUBLAS_WORKSPACE_CONFIG"] == (setup["runtime"]["cublasWorkspaceConfig"] or None)
phases = [p["phase"] for p in report["phases"]]
assert phases[0] == "init" and phases[-1] == "optimizerStep:2" and "outOfMemory" not in report, phases
assert report["predicted"] == predicted and predicted["peakAllocatedBytes"] > 0
print(f"{os.path.basename(script)}: {len(calls)} calls as its setup says")
