"""A stand-in for transformers (tests/measure_fakes/torch says why): a model with one parameter
per config value it needs, whose forward returns a loss."""
import types

import torch
from calls import record

__version__ = "fake"


class AutoConfig:
    @staticmethod
    def for_model(model_type, **fields):
        record("config", model_type=model_type, fields=fields)
        return types.SimpleNamespace(model_type=model_type, **fields)


class _Model:
    def __init__(self, config, dtype, attn_implementation):
        self.config = config
        self.weight = torch.Parameter((config.vocab_size, 8), dtype)
        self.head = torch.Parameter((8, 8), dtype)

    def save_pretrained(self, folder):
        record("save_pretrained")

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
        record("gradient_checkpointing_enable", kwargs=gradient_checkpointing_kwargs)

    def enable_input_require_grads(self):
        record("enable_input_require_grads")

    def train(self):
        return self

    def parameters(self):
        return [p for p in (self.weight, self.head)]

    def zero_grad(self, set_to_none=True):
        for p in self.parameters():
            p.grad = None if set_to_none else p.grad

    def __call__(self, input_ids, attention_mask, labels, token_type_ids=None):
        record("forward", batch=input_ids.shape, labels=labels.shape, token_type_ids=token_type_ids is not None)
        return types.SimpleNamespace(loss=torch.Tensor(()))


class BitsAndBytesConfig:
    def __init__(self, **arguments):
        record("BitsAndBytesConfig", **arguments)


class _Auto:
    def __init__(self, task):
        self.task = task

    def from_pretrained(self, folder, quantization_config=None, device_map=None, attn_implementation=None, dtype=None):
        record("from_pretrained", task=self.task, dtype=dtype, attn_implementation=attn_implementation,
               device_map=device_map, quantized=isinstance(quantization_config, BitsAndBytesConfig))
        return _Model(self._config, dtype, attn_implementation)

    def from_config(self, config, dtype=None, attn_implementation=None):
        record("from_config", task=self.task, dtype=dtype, attn_implementation=attn_implementation)
        self._config = config
        return _Model(config, dtype, attn_implementation)


AutoModelForCausalLM = _Auto("causalLm")
AutoModelForSequenceClassification = _Auto("sequenceClassification")
AutoModelForMaskedLM = _Auto("maskedLm")
