#!/usr/bin/env python3
"""Writes the committed seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/).

Seeds are real inputs (tests/data setups and config.json files, the docs/schema.md example, every
preset, the CLI's examples, safetensors headers shaped like real checkpoints) and malformed or
hostile texts (truncation, deep nesting, huge and negative numbers, wrong types, invalid UTF-8,
duplicate keys). Re-run after adding a preset or a schema field:

    python3 tests/fuzz/make_seed_corpus.py [path/to/gpumem CLI, for presets and examples]

Without the CLI the preset list below is used as it stands. File names say what a seed is.
"""
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DATA = os.path.join(ROOT, "tests", "data")
CORPUS = os.path.join(HERE, "corpus")

PRESETS = ["gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "bert-base-uncased", "bert-large-uncased",
           "llama-2-7b", "llama-2-13b", "llama-2-70b", "tinyllama-1.1b", "mistral-7b-v0.1", "llama-3-8b",
           "llama-3-70b", "llama-3.1-405b", "llama-3.2-1b", "llama-3.2-3b", "mistral-7b-v0.3", "qwen2.5-0.5b",
           "qwen2.5-1.5b", "qwen2.5-7b", "qwen2.5-14b", "qwen2.5-72b", "gemma-2b", "gemma-7b", "phi-3-mini-4k",
           "mixtral-8x7b", "mixtral-8x22b", "qwen1.5-moe-a2.7b"]


def compact(obj):
    return json.dumps(obj, separators=(",", ":"))


def write(target, name, text):
    folder = os.path.join(CORPUS, target)
    os.makedirs(folder, exist_ok=True)
    data = text if isinstance(text, bytes) else text.encode("utf-8")
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data)


def read(path):
    with open(path, "rb") as f:
        return f.read()


# Texts no entry point may choke on.
HOSTILE = {
    "empty": b"",
    "truncated-object": b'{"training":',
    "not-an-object-array": b"[1, 2, 3]",
    "not-an-object-null": b"null",
    "not-an-object-string": b'"setup"',
    "deep-nesting-65": b"[" * 65 + b"]" * 65,
    "deep-nesting-unbalanced": b'{"a":' * 200,
    "brackets-in-strings": b'{"x": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["}',
    "invalid-utf8": b'{"\xff\xfe": "\xc3\x28"}',
    "lone-surrogate-escape": b'{"\\ud800": 1}',
    "nul-in-key": b'{"a\\u0000b": 1}',
    "bom": b'\xef\xbb\xbf{}',
    "trailing-garbage": b"{} {}",
    "nan-literal": b'{"x": NaN}',
}


def setups():
    mlp = json.loads(read(os.path.join(DATA, "mlp.json")))
    yield "tests-data-mlp", read(os.path.join(DATA, "mlp.json"))
    yield "tests-data-bad-setup", read(os.path.join(DATA, "bad_setup.json"))
    yield "empty-object", b"{}"
    # docs/schema.md's example document.
    yield "schema-example", compact({
        "schemaVersion": 1,
        "model": {"kind": "parameterCount", "parameterCount": 1500000000,
                  "largestMatrices": [{"rows": 1024, "cols": 240000}],
                  "layers": [{"type": "embedding", "numEmbeddings": 50257, "embeddingDim": 768},
                             {"type": "linear", "inFeatures": 768, "outFeatures": 3072, "bias": True},
                             {"type": "gelu"}, {"type": "dropout", "p": 0.1}],
                  "loss": "crossEntropy"},
        "training": {"batchSize": 1, "sequenceLength": 1024, "precision": "fp16Mixed", "optimizer": "adam",
                     "optimizerImplementation": "forEach", "adafactorBeta1": False, "zeroGradSetToNone": True},
        "gpu": {"memoryGiB": 80}})
    yield "layers-embedding-gelu-dropout", compact({
        "model": {"kind": "layers", "loss": "crossEntropy",
                  "layers": [{"type": "embedding", "numEmbeddings": 1000, "embeddingDim": 64},
                             {"type": "linear", "inFeatures": 64, "outFeatures": 256},
                             {"type": "gelu"}, {"type": "dropout", "p": 0.1},
                             {"type": "tanh"}, {"type": "sigmoid"},
                             {"type": "linear", "inFeatures": 256, "outFeatures": 1000, "bias": False}]},
        "training": {"batchSize": 4, "sequenceLength": 32, "precision": "bf16Mixed", "optimizer": "adafactor",
                     "optimizerImplementation": "perParameter", "adafactorBeta1": True}})
    yield "quick-adafactor-ampfp16", compact({
        "model": {"kind": "parameterCount", "parameterCount": 7000000000,
                  "largestMatrices": [{"rows": 4096, "cols": 11008}, {"rows": 32000, "cols": 4096}]},
        "training": {"precision": "ampFp16", "optimizer": "adafactor", "zeroGradSetToNone": False},
        "gpu": {"id": "nvidia-rtx-4090"}})
    yield "mlp-sgd-fused", compact({**mlp, "training": {**mlp["training"], "optimizer": "sgdMomentum",
                                                        "optimizerImplementation": "fused"}})
    # Every preset, small enough to estimate quickly, with the knobs varied across them.
    precisions = ["fp32", "fp16Mixed", "bf16Mixed", "bf16", "ampBf16", "ampFp16"]
    optimizers = ["adamw", "adam", "sgd", "sgdMomentum", "adafactor"]
    checkpointings = ["none", "everyBlock", "everyKthBlock", "selective"]
    for i, preset in enumerate(PRESETS):
        yield f"preset-{preset}", compact({
            "model": {"preset": preset},
            "training": {"batchSize": 1 + i % 3, "sequenceLength": 64 << (i % 3),
                         "precision": precisions[i % 6], "optimizer": optimizers[i % 5],
                         "optimizerImplementation": ["forEach", "perParameter", "fused"][i % 3] if i % 5 != 4 else "forEach",
                         "attention": ["eager", "sdpa"][i % 2], "checkpointing": checkpointings[i % 4],
                         "checkpointInterval": 1 + i % 3},
            "gpu": {"memoryGiB": 24 + 8 * i}})
    # Architectures by hand, every family and every field.
    yield "arch-llama-moe-shared-expert", compact({
        "model": {"kind": "transformer", "architecture": {
            "family": "llama", "vocabSize": 1000, "hiddenSize": 64, "numLayers": 2, "numHeads": 4,
            "numKeyValueHeads": 2, "headDim": 16, "intermediateSize": 128, "numExperts": 4, "expertsPerToken": 2,
            "expertIntermediateSize": 32, "sharedExpertIntermediateSize": 64, "sharedExpertGate": True,
            "attentionBias": True, "tieWordEmbeddings": True, "hiddenAct": "silu",
            "hiddenDropout": 0.1, "attentionDropout": 0.1}},
        "training": {"batchSize": 2, "sequenceLength": 16, "precision": "ampBf16", "attention": "eager",
                     "checkpointing": "selective"}})
    yield "arch-gpt2-gelunew", compact({
        "model": {"kind": "transformer", "architecture": {
            "family": "gpt2", "vocabSize": 500, "hiddenSize": 32, "numLayers": 3, "numHeads": 2,
            "maxPositionEmbeddings": 64, "hiddenAct": "geluNew", "hiddenDropout": 0.1, "attentionDropout": 0.1}},
        "training": {"batchSize": 2, "sequenceLength": 64, "checkpointing": "everyKthBlock", "checkpointInterval": 2}})
    yield "arch-bert-maskedlm", compact({
        "model": {"kind": "transformer", "architecture": {
            "family": "bert", "vocabSize": 300, "hiddenSize": 32, "numLayers": 2, "numHeads": 4,
            "maxPositionEmbeddings": 32, "typeVocabSize": 2, "encoderHead": "maskedLm", "hiddenAct": "gelu"}},
        "training": {"batchSize": 3, "sequenceLength": 32, "precision": "fp16Mixed"}})
    yield "arch-bert-classification", compact({
        "model": {"kind": "transformer", "architecture": {
            "family": "bert", "hiddenSize": 16, "numLayers": 1, "numHeads": 2, "vocabSize": 50,
            "maxPositionEmbeddings": 8, "encoderHead": "classification", "numLabels": 5, "hiddenAct": "geluTanh"}},
        "training": {"sequenceLength": 8}})
    # Edges and hostile values.
    yield "limits-at-max", compact({"model": {"kind": "parameterCount", "parameterCount": 100000000000000},
                                    "training": {"batchSize": 1000000, "sequenceLength": 10000}})
    yield "huge-numbers", compact({"model": {"kind": "parameterCount", "parameterCount": 1e300},
                                   "training": {"batchSize": 18446744073709551615, "sequenceLength": -9223372036854775808},
                                   "gpu": {"memoryGiB": 1e308}})
    yield "float-counts", b'{"training": {"batchSize": 1.5, "sequenceLength": 1e3}, "gpu": {"memoryGiB": -0.0}}'
    yield "wrong-types", compact({"schemaVersion": "1", "model": [], "training": {"batchSize": "8", "precision": 3,
                                  "zeroGradSetToNone": "yes"}, "gpu": {"id": 7}})
    yield "unknown-everything", compact({"modle": {}, "training": {"batchsize": 1}, "gpu": {"vram": 1},
                                         "model": {"preset": "llama-9000", "kind": "rnn"}})
    yield "layers-hostile", compact({"model": {"kind": "layers", "layers": [
        {"type": "relu"}, {"type": "embedding", "numEmbeddings": 0, "embeddingDim": -1},
        {"type": "linear", "inFeatures": 1000000000, "outFeatures": 1000000000},
        {"type": "dropout", "p": 1.0}, {"type": "conv2d"}, 5, None], "loss": "hinge"}})
    yield "layers-empty", compact({"model": {"kind": "layers", "layers": []}})
    yield "arch-zero-heads", compact({"model": {"kind": "transformer", "architecture": {
        "family": "llama", "hiddenSize": 10, "numHeads": 0, "numKeyValueHeads": 3, "numLayers": 100000}}})
    yield "duplicate-keys", b'{"training": {"batchSize": 1, "batchSize": 2}, "training": {"batchSize": 3}}'


def configs():
    for name in sorted(os.listdir(os.path.join(DATA, "configs"))):
        yield f"tests-data-{name[:-5]}", read(os.path.join(DATA, "configs", name))
    yield "gemma-2b", compact({"model_type": "gemma", "architectures": ["GemmaForCausalLM"], "hidden_size": 2048,
                               "intermediate_size": 16384, "num_attention_heads": 8, "num_hidden_layers": 18,
                               "num_key_value_heads": 1, "head_dim": 256, "vocab_size": 256000,
                               "hidden_act": "gelu", "hidden_activation": "gelu_pytorch_tanh"})
    yield "phi3-mini", compact({"model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192,
                                "num_attention_heads": 32, "num_hidden_layers": 32, "vocab_size": 32064,
                                "hidden_act": "silu", "tie_word_embeddings": False})
    yield "qwen3", compact({"model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072,
                            "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
                            "num_hidden_layers": 28, "vocab_size": 151936, "tie_word_embeddings": True})
    yield "qwen2-moe", compact({"model_type": "qwen2_moe", "hidden_size": 2048, "intermediate_size": 5632,
                                "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
                                "num_experts": 60, "num_experts_per_tok": 4, "num_attention_heads": 16,
                                "num_hidden_layers": 24, "vocab_size": 151936})
    yield "mistral", compact({"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336,
                              "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,
                              "vocab_size": 32768, "attention_dropout": 0.0})
    yield "bert-maskedlm", compact({"model_type": "bert", "architectures": ["BertForMaskedLM"], "hidden_size": 768,
                                    "intermediate_size": 3072, "num_attention_heads": 12, "num_hidden_layers": 12,
                                    "max_position_embeddings": 512, "type_vocab_size": 2, "vocab_size": 30522,
                                    "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
                                    "id2label": {"0": "a", "1": "b", "2": "c"}})
    yield "gpt2-n-inner", compact({"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "n_inner": 100,
                                   "n_positions": 128, "vocab_size": 1000, "activation_function": "gelu_fast",
                                   "resid_pdrop": 0.1, "attn_pdrop": 0.1})
    yield "missing-hidden-size", b'{"model_type": "llama", "num_hidden_layers": 2}'
    yield "unknown-model-type", b'{"model_type": "phi", "hidden_size": 8}'
    yield "wrong-types", compact({"model_type": "llama", "hidden_size": "big", "num_hidden_layers": 2.5,
                                  "num_attention_heads": -2, "intermediate_size": 1e30, "vocab_size": None,
                                  "hidden_act": "relu2", "tie_word_embeddings": "no"})
    yield "zero-heads", compact({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
                                 "num_attention_heads": 0, "num_key_value_heads": 0, "intermediate_size": 8,
                                 "vocab_size": 10})
    yield "huge", compact({"model_type": "mixtral", "hidden_size": 9223372036854775807, "num_hidden_layers": 1e18,
                           "num_attention_heads": 1, "intermediate_size": 1, "vocab_size": 1,
                           "num_local_experts": 4294967296, "num_experts_per_tok": 0})


def gpt2_header():
    """The names and shapes of openai-community/gpt2's model.safetensors (F32, 124M)."""
    tensors = [("wte.weight", [50257, 768]), ("wpe.weight", [1024, 768])]
    for i in range(12):
        p = f"h.{i}."
        tensors += [(p + "ln_1.weight", [768]), (p + "ln_1.bias", [768]),
                    (p + "attn.c_attn.weight", [768, 2304]), (p + "attn.c_attn.bias", [2304]),
                    (p + "attn.c_proj.weight", [768, 768]), (p + "attn.c_proj.bias", [768]),
                    (p + "ln_2.weight", [768]), (p + "ln_2.bias", [768]),
                    (p + "mlp.c_fc.weight", [768, 3072]), (p + "mlp.c_fc.bias", [3072]),
                    (p + "mlp.c_proj.weight", [3072, 768]), (p + "mlp.c_proj.bias", [768])]
    tensors += [("ln_f.weight", [768]), ("ln_f.bias", [768])]
    return header(tensors, "F32")


def header(tensors, dtype, size=None):
    size = size or {"F32": 4, "BF16": 2, "F16": 2, "I8": 1}[dtype]
    out = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in tensors:
        n = 1
        for d in shape:
            n *= d
        out[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n * size]}
        offset += n * size
    return compact(out)


def llama_header(hidden=64, layers=2, vocab=1000, inter=172, kv=16):
    tensors = [("model.embed_tokens.weight", [vocab, hidden])]
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors += [(p + "self_attn.q_proj.weight", [hidden, hidden]), (p + "self_attn.k_proj.weight", [kv, hidden]),
                    (p + "self_attn.v_proj.weight", [kv, hidden]), (p + "self_attn.o_proj.weight", [hidden, hidden]),
                    (p + "mlp.gate_proj.weight", [inter, hidden]), (p + "mlp.up_proj.weight", [inter, hidden]),
                    (p + "mlp.down_proj.weight", [hidden, inter]), (p + "input_layernorm.weight", [hidden]),
                    (p + "post_attention_layernorm.weight", [hidden])]
    tensors += [("model.norm.weight", [hidden]), ("lm_head.weight", [vocab, hidden])]
    return header(tensors, "BF16")


def safetensors():
    yield "gpt2-header", gpt2_header()
    yield "small-llama-header", llama_header()
    yield "no-offsets", b'{"w": {"dtype": "F32", "shape": [10, 10]}, "b": {"dtype": "F16", "shape": [10]}}'
    yield "sharded-headers", (b'[{"a.weight": {"dtype": "BF16", "shape": [4, 4]}},'
                              b' {"__metadata__": {"format": "pt"}, "b.weight": {"dtype": "BF16", "shape": [2, 3]}}]')
    yield "sharded-duplicate", b'[{"a": {"dtype": "F32", "shape": [1]}}, {"a": {"dtype": "F32", "shape": [1]}}]'
    yield "index", compact({"metadata": {"total_size": 13476839424},
                            "weight_map": {"model.layers.0.mlp.up_proj.weight": "model-00001-of-00002.safetensors",
                                           "model.layers.31.mlp.up_proj.weight": "model-00002-of-00002.safetensors",
                                           "lm_head.weight": "model-00002-of-00002.safetensors"}})
    yield "all-dtypes", compact({f"t.{d}": {"dtype": d, "shape": [3, 5]} for d in
                                 ["F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2", "I64", "I32", "I16", "I8",
                                  "U64", "U32", "U16", "U8", "BOOL"]})
    yield "scalar-and-empty-shapes", b'{"s": {"dtype": "F32", "shape": []}, "z": {"dtype": "F32", "shape": [0, 7]}}'
    yield "bad-offsets", b'{"w": {"dtype": "F32", "shape": [10, 10], "data_offsets": [0, 10]}}'
    yield "reversed-offsets", b'{"w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}'
    yield "unknown-dtype", b'{"w": {"dtype": "F99", "shape": [1]}}'
    yield "negative-shape", b'{"w": {"dtype": "F32", "shape": [-1]}}'
    yield "overflowing-shape", b'{"w": {"dtype": "F32", "shape": [1000000000, 1000000000, 1000000000]}}'
    yield "huge-offsets", b'{"w": {"dtype": "U8", "shape": [1], "data_offsets": [18446744073709551615, 0]}}'
    yield "float-shape", b'{"w": {"dtype": "F32", "shape": [1.5, 2e30]}}'
    yield "index-hostile", b'{"metadata": {"total_size": -5}, "weight_map": {"a": 3, "b": null}}'
    yield "empty-list", b"[]"


def main():
    cli = sys.argv[1] if len(sys.argv) > 1 else None
    if os.path.isdir(CORPUS):
        shutil.rmtree(CORPUS)
    estimate_seeds = dict(setups())
    if cli:
        options = json.loads(subprocess.run([cli, "--options"], check=True, capture_output=True).stdout)
        for example in options["examples"]:
            estimate_seeds["cli-example-" + example["id"]] = compact(example["setup"])
        estimate_seeds["cli-defaults"] = subprocess.run([cli, "--defaults"], check=True, capture_output=True).stdout
    for name, text in {**estimate_seeds, **HOSTILE}.items():
        write("fuzz_estimate_json", name, text)
        write("fuzz_measure_script_json", name, text)  # the same setups: the script is made from one
    for name, text in {**dict(configs()), **HOSTILE}.items():
        write("fuzz_import_config_json", name, text)
    headers = {**dict(safetensors()), **HOSTILE}
    for name, text in headers.items():
        write("fuzz_import_safetensors_json", name, text)
    # Header and setup joined by a NUL byte (the with-setup target splits there).
    pairs = {
        "gpt2-header+preset-gpt2": (gpt2_header(), '{"model":{"preset":"gpt2"},"training":{"sequenceLength":8}}'),
        "llama-header+small-llama": (llama_header(), estimate_seeds["arch-llama-moe-shared-expert"]),
        "no-offsets+preset-llama-2-7b": (headers["no-offsets"], estimate_seeds["preset-llama-2-7b"]),
        "index+preset-mixtral": (headers["index"], estimate_seeds["preset-mixtral-8x7b"]),
        "header+quick-setup": (headers["all-dtypes"], estimate_seeds["quick-adafactor-ampfp16"]),
        "header+bad-setup": (headers["sharded-headers"], read(os.path.join(DATA, "bad_setup.json"))),
        "header+malformed-setup": (headers["no-offsets"], b'{"model":'),
        "header+empty-setup": (headers["no-offsets"], b""),
        "bad-header+setup": (headers["bad-offsets"], estimate_seeds["arch-bert-maskedlm"]),
    }
    for name, (h, s) in pairs.items():
        h = h if isinstance(h, bytes) else h.encode()
        s = s if isinstance(s, bytes) else s.encode()
        write("fuzz_import_safetensors_with_setup_json", name, h + b"\0" + s)
    # The solver reruns the estimate dozens of times: small setups only (scripts/test: -max_len=1024).
    for name, text in estimate_seeds.items():
        data = text if isinstance(text, bytes) else text.encode()
        try:  # pretty-printed files (tests/data) compacted to fit -max_len
            data = compact(json.loads(data)).encode()
        except ValueError:
            pass
        if len(data) <= 1024 and not name.startswith("preset-llama-3.1-405b"):
            write("fuzz_solve_json", name, data)
    for name, text in HOSTILE.items():
        write("fuzz_solve_json", name, text)


if __name__ == "__main__":
    main()
