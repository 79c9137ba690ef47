#!/usr/bin/env python3
"""Writes tests/data/cuda/cases.json: the training runs scripts/measure_cuda.py measures on a GPU.

Each case holds a Hugging Face config (what the GPU machine builds with transformers, random
weights: nothing can be downloaded there), how it is trained there (precision, attention,
checkpointing, PEFT LoRA), and the gpumem setup that describes the same run. The setup's model
comes from gpumem's own importer (`gpumem --import-config`), so the GPU side never translates
anything: it reads the Hugging Face half, the estimator the gpumem half.

Usage: python3 scripts/cuda_cases.py [path/to/gpumem]   (default build/native/cli/gpumem)
"""
import copy
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(ROOT, "tests", "data", "configs")

# Llama 3.2 1B's published config.json (meta-llama/Llama-3.2-1B), the fields that shape memory.
LLAMA_32_1B = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 128256,
    "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "hidden_act": "silu",
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "tie_word_embeddings": True, "attention_bias": False, "mlp_bias": False,
    "bos_token_id": 128000, "eos_token_id": 128001,
}


def config(name, **overrides):
    with open(os.path.join(CONFIGS, name)) as f:
        c = json.load(f)
    c.update(overrides)
    return c


def case(name, hf_config, precision, batch, seq, attention="sdpa", checkpointing="none", lora=None,
         task="causalLm", snapshot=False, optimizer="adamw", implementation="forEach"):
    return {"name": name, "hfConfig": hf_config, "task": task, "precision": precision,
            "batchSize": batch, "sequenceLength": seq, "attention": attention,
            "checkpointing": checkpointing, "lora": lora, "optimizer": optimizer,
            "optimizerImplementation": implementation, "snapshot": snapshot}


CASES = [
    case("gpt2-amp-eager-b8", config("gpt2.json"), "ampBf16", 8, 1024, attention="eager", snapshot=True),
    case("gpt2-amp-sdpa-b8", config("gpt2.json"), "ampBf16", 8, 1024),
    case("gpt2-fp32-sdpa-b4", config("gpt2.json"), "fp32", 4, 1024),
    case("llama3.2-1b-bf16-sdpa-b4-s2048", LLAMA_32_1B, "bf16", 4, 2048),
    case("llama3.2-1b-amp-sdpa-ckpt-b4-s2048", LLAMA_32_1B, "ampBf16", 4, 2048, checkpointing="everyBlock"),
    case("llama3.2-1b-bf16mixed-eager-b1-s2048", LLAMA_32_1B, "bf16Mixed", 1, 2048, attention="eager"),
    case("qwen2.5-1.5b-amp-sdpa-b2-s2048", config("qwen2.5-1.5b.json"), "ampBf16", 2, 2048),
    case("llama2-7b-lora-qv-bf16-sdpa-b1-s2048", config("llama-2-7b.json"), "bf16", 1, 2048,
         lora={"r": 8, "loraAlpha": 16, "targetModules": ["q_proj", "v_proj"]}),
    case("llama2-7b-lora-all-bf16-ckpt-b4-s2048", config("llama-2-7b.json"), "bf16", 4, 2048,
         checkpointing="everyBlock",
         lora={"r": 16, "loraAlpha": 32, "targetModules": ["q_proj", "k_proj", "v_proj", "o_proj",
                                                          "gate_proj", "up_proj", "down_proj"]}),
    case("bert-base-cls-ampfp16-b32-s512", config("bert-base-uncased.json"), "ampFp16", 32, 512,
         task="sequenceClassification"),
    case("mixtral-2layer-bf16-sdpa-b1-s1024", config("mixtral-8x7b.json", num_hidden_layers=2), "bf16", 1, 1024),
    # Breadth: the Llama family's eager path under autocast, fused and per-parameter AdamW,
    # fp16 with GradScaler on a decoder, a 7B LoRA on all linears without checkpointing, and
    # models without transformers' training-time cache (use_cache=False; docs/validation.md).
    case("qwen2.5-1.5b-amp-eager-nocache-b1-s2048", config("qwen2.5-1.5b.json", use_cache=False), "ampBf16", 1, 2048,
         attention="eager"),
    case("llama3.2-1b-bf16-sdpa-fused-b2-s2048", LLAMA_32_1B, "bf16", 2, 2048, implementation="fused"),
    case("llama3.2-1b-amp-sdpa-perparam-b2-s2048", LLAMA_32_1B, "ampBf16", 2, 2048, implementation="perParameter"),
    case("gpt2-ampfp16-sdpa-nocache-b8", config("gpt2.json", use_cache=False), "ampFp16", 8, 1024),
    case("gpt2-bf16mixed-eager-nocache-b16", config("gpt2.json", use_cache=False), "bf16Mixed", 16, 1024, attention="eager"),
    case("llama2-7b-lora-all-bf16-sdpa-b2-s1024", config("llama-2-7b.json"), "bf16", 2, 1024,
         lora={"r": 16, "loraAlpha": 32, "targetModules": ["q_proj", "k_proj", "v_proj", "o_proj",
                                                          "gate_proj", "up_proj", "down_proj"]}),
    case("bert-base-cls-fp32-b16-s512", config("bert-base-uncased.json"), "fp32", 16, 512, task="sequenceClassification"),
]


def gpumem_setup(gpumem, c):
    """The gpumem setup of a case: the importer's model, then the training the GPU side runs."""
    with open("/tmp/gpumem_cuda_case_config.json", "w") as f:
        json.dump(c["hfConfig"], f)
    out = subprocess.run([gpumem, "--import-config", "/tmp/gpumem_cuda_case_config.json"],
                         capture_output=True, text=True, check=True)
    setup = json.loads(out.stdout)["setup"]
    if c["task"] == "sequenceClassification":
        setup["model"]["architecture"]["encoderHead"] = "classification"
        setup["model"]["architecture"]["numLabels"] = 2
    # The importer's training fields (use_cache=False configs: useCache false), then the case's.
    setup["training"] = {**setup.get("training", {}), "batchSize": c["batchSize"], "sequenceLength": c["sequenceLength"],
                         "precision": c["precision"], "optimizer": c["optimizer"],
                         "optimizerImplementation": c.get("optimizerImplementation", "forEach"),
                         "attention": c["attention"],
                         "checkpointing": c["checkpointing"]}
    setup["gpu"] = {"id": "nvidia-h100-sxm"}
    # The GPU machine's software (docs/validation.md, "CUDA truth"): PyTorch 2.11 on CUDA 13.0.
    setup["runtime"] = {"pytorchVersion": "2.11", "cudaVersion": "13.0"}
    if c["lora"]:
        setup["finetune"] = {"lora": True, "r": c["lora"]["r"], "loraAlpha": c["lora"]["loraAlpha"],
                             "targetModules": c["lora"]["targetModules"], "adapterDType": "fp32"}
    return setup


def main():
    gpumem = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build", "native", "cli", "gpumem")
    cases = []
    for c in CASES:
        c = copy.deepcopy(c)
        c["setup"] = gpumem_setup(gpumem, c)
        cases.append(c)
    out = os.path.join(ROOT, "tests", "data", "cuda", "cases.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump({"about": "Runs scripts/measure_cuda.py measures on a GPU; written by scripts/cuda_cases.py.",
                   "cases": cases}, f, indent=1)
        f.write("\n")
    print(f"{len(cases)} cases -> {out}")


if __name__ == "__main__":
    main()
