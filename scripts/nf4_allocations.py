#!/usr/bin/env python3
"""The allocations of torchao's NF4Tensor.from_tensor, op by op, on the CPU.

Usage: /usr/bin/python3 scripts/nf4_allocations.py PATH/TO/nf4tensor.py

Reads get_block_absmax, double_quantize_scalers, convert_to_norm_float_weight and
quantize_tensor_nearest from the given torchao source file (torchao/dtypes/nf4tensor.py, or
torchao/quantization/quantize_/workflows/nf4/nf4_tensor.py since 2026), runs from_tensor's
sequence (the nf4 table, double_quantize_scalers(x.flatten()), convert_to_norm_float_weight) on
a bf16 [256, 256] weight under PyTorch's profiler (the byte-exact tracker of scripts/validate.py)
and prints each allocation (+bytes) and free (−bytes) in order. The check behind
tests/loading_test.cpp's FromTensorEvents (core/src/sim/loading.cpp): the same sizes in the same
order, less the few-byte scalar temporaries and the parts kept inside the NF4Tensor (the table,
the int8 scalers, the factors, the mean), which gpumem counts in the parameter's one block.
"""
import ast
import math
import sys

import torch
from torch.profiler import ProfilerActivity, profile

FUNCTIONS = {"get_block_absmax", "double_quantize_scalers", "convert_to_norm_float_weight",
             "quantize_tensor_nearest"}


class NF4Tensor:  # holds the static methods read from the source
    pass


def load(path):
    namespace = {"torch": torch, "math": math, "CHUNK_SIZE": 1024**2, "NF4Tensor": NF4Tensor}
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.FunctionDef) and node.name in FUNCTIONS:
            node.decorator_list, node.returns = [], None
            for arg in node.args.args:
                arg.annotation = None
            module = ast.fix_missing_locations(ast.Module(body=[node], type_ignores=[]))
            exec(compile(module, path, "exec"), namespace)
            setattr(NF4Tensor, node.name, staticmethod(namespace[node.name]))


def from_tensor(weight):
    nf4 = torch.tensor([-1.0, -0.6962, -0.5251, -0.3949, -0.2844, -0.1848, -0.0911, 0.0, 0.0796,
                        0.1609, 0.2461, 0.3379, 0.4407, 0.5626, 0.7230, 1.0], dtype=weight.dtype)
    scalers = NF4Tensor.double_quantize_scalers(weight.flatten(), 64, 256)
    data = NF4Tensor.convert_to_norm_float_weight(weight, weight.numel() // 64, 64, nf4)
    return nf4, scalers, data


def main():
    load(sys.argv[1])
    weight = torch.randn(256, 256, dtype=torch.bfloat16)

    def run():
        result = from_tensor(weight)
        del result

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    # By time, ties in the profiler's own order (a stable sort).
    memory = sorted(((ev.start_us(), ev.nbytes()) for ev in prof.profiler.kineto_results.events()
                     if ev.name() == "[memory]"), key=lambda m: m[0])
    print(" ".join(f"{b:+d}" for _, b in memory))


if __name__ == "__main__":
    main()
