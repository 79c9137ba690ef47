#!/bin/sh
# The measuring script (gpumem --measure-script) for setups of each kind it takes (twelve): every one
# compiles, its module-level code (the embedded config, figures and setup) runs as far as --help,
# and its training loop runs against the stand-ins of tests/measure_fakes, doing what its setup
# says (measure_script_check.py). Usage: measure_script_python.sh CLI PYTHON3 WORKDIR
set -eu
cli="$1"
python="$2"
work="$3"
rm -rf "$work" && mkdir -p "$work"
n=0
for setup in \
  '{"model":{"preset":"gpt2"}}' \
  '{"model":{"preset":"bert-base-uncased"},"training":{"precision":"ampFp16","batchSize":8,"sequenceLength":128}}' \
  '{"model":{"preset":"llama-3.2-1b"},"training":{"precision":"ampBf16","attention":"sdpa","checkpointing":"everyBlock","sequenceLength":2048},"runtime":{"allocator":{"expandableSegments":true,"maxSplitSizeMiB":128}}}' \
  '{"model":{"preset":"qwen2.5-0.5b"},"training":{"precision":"bf16","sequenceLength":512},"finetune":{"lora":true,"r":16,"loraAlpha":32,"targetModules":["all-linear"],"useDora":true}}' \
  '{"model":{"preset":"gemma-2-2b"},"training":{"precision":"bf16Mixed","sequenceLength":512,"optimizerImplementation":"perParameter"},"runtime":{"cublasWorkspaceConfig":":4096:8","lazyModuleLoading":false}}' \
  '{"model":{"preset":"qwen1.5-moe-a2.7b"},"training":{"precision":"bf16","sequenceLength":256,"optimizer":"sgdMomentum"}}' \
  '{"model":{"preset":"pythia-160m"},"training":{"precision":"fp32","sequenceLength":256,"zeroGradSetToNone":false}}' \
  '{"model":{"preset":"smollm3-3b"},"training":{"precision":"ampBf16","sequenceLength":256,"optimizer":"pagedAdamw8bit"},"parallel":{"gradientAccumulationSteps":4}}' \
  '{"model":{"preset":"bert-large-uncased"},"training":{"precision":"ampFp16","sequenceLength":128,"optimizer":"adafactor","optimizerImplementation":"perParameter","adafactorBeta1":true}}' \
  '{"model":{"preset":"llama-3-8b"},"training":{"precision":"bf16","attention":"sdpa","sequenceLength":512,"optimizer":"pagedAdamw"},"finetune":{"lora":true,"r":16,"targetModules":["all-linear"],"quantization":"nf4","doubleQuant":true,"computeDType":"bf16","prepareForKbitTraining":true}}' \
  '{"model":{"preset":"mistral-7b-v0.1"},"training":{"precision":"fp32","sequenceLength":256,"checkpointing":"everyBlock","useReentrant":false},"finetune":{"lora":true,"quantization":"int8"}}' \
  '{"model":{"preset":"llama-3.2-1b"},"training":{"precision":"bf16","attention":"sdpa","sequenceLength":1024,"optimizerInBackward":true,"emptyCacheSteps":2}}'
do
  n=$((n + 1))
  script="$work/measure_$n.py"
  echo "$setup" | "$cli" --measure-script - >"$script"
  "$python" -m py_compile "$script"
  "$python" "$script" --help >"$work/help_$n.txt"
  grep -q "Measure the training step gpumem estimated" "$work/help_$n.txt"
  "$python" "$(dirname "$0")/measure_script_check.py" "$script" "$work/calls_$n.jsonl"
done
echo "$n measuring scripts compile, run to --help and train against the stand-ins as their setups say"
