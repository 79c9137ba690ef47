"""A stand-in for peft: the LoRA config and get_peft_model's arguments are recorded; the adapters
are one more trainable parameter and the base ones are frozen."""
import torch
from calls import record

__version__ = "fake"


class LoraConfig:
    def __init__(self, task_type=None, r=8, lora_alpha=8, lora_dropout=0.0, target_modules=None, use_dora=False):
        record("LoraConfig", task_type=task_type, r=r, lora_alpha=lora_alpha, lora_dropout=lora_dropout,
               target_modules=target_modules, use_dora=use_dora)


def get_peft_model(model, config, autocast_adapter_dtype=True):
    record("get_peft_model", autocast_adapter_dtype=autocast_adapter_dtype)
    for p in model.parameters():
        p.requires_grad = False
    adapter = torch.Parameter((8, 2), "float32")
    base_parameters = model.parameters
    model.parameters = lambda: base_parameters() + [adapter]
    return model


def prepare_model_for_kbit_training(model, use_gradient_checkpointing=True, gradient_checkpointing_kwargs=None):
    record("prepare_model_for_kbit_training", use_gradient_checkpointing=use_gradient_checkpointing,
           kwargs=gradient_checkpointing_kwargs)
    return model
