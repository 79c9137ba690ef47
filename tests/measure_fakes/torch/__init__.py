"""A stand-in for PyTorch, enough for gpumem's measuring script to run its training loop on a
machine without a GPU (tests/measure_script_python.sh): tensors are shapes, every call is
recorded (calls.py), the memory figures are fixed numbers."""
import contextlib
import types

from calls import record

__version__ = "fake"
version = types.SimpleNamespace(cuda="fake")
float32, float16, bfloat16, long = "float32", "float16", "bfloat16", "int64"


class OutOfMemoryError(RuntimeError):
    pass


class Tensor:
    def __init__(self, shape=(1,), dtype=float32, requires_grad=False):
        self.shape, self.dtype, self.requires_grad, self.grad = tuple(shape), dtype, requires_grad, None

    def to(self, where):
        return self if where == "cuda" else Tensor(self.shape, where, self.requires_grad)

    def float(self):
        return Tensor(self.shape, float32)

    def detach(self):
        return Tensor(self.shape, self.dtype)

    def copy_(self, other):
        assert other.shape == self.shape
        return self

    def backward(self):
        record("backward")
        for p in _live_parameters:
            if p.requires_grad:
                p.grad = Tensor(p.shape, p.dtype)
                for hook in p.hooks:
                    hook(p)

    def __float__(self):
        return 0.0


_live_parameters = []


class Parameter(Tensor):
    def __init__(self, shape, dtype):
        super().__init__(shape, dtype, True)
        self.hooks = []
        _live_parameters.append(self)

    def register_post_accumulate_grad_hook(self, hook):
        record("post_accumulate_grad_hook")
        self.hooks.append(hook)


def ones(*shape, device=None, dtype=float32):
    return Tensor(shape, dtype)


def zeros(shape, dtype=float32):
    return Tensor(shape, dtype)


def randint(low, high, shape, generator=None):
    assert high > low
    return Tensor(shape, long)


def manual_seed(seed):
    pass


class Generator:
    def manual_seed(self, seed):
        return self


def device(name):
    assert name == "cuda"
    return contextlib.nullcontext()


@contextlib.contextmanager
def autocast(device_type, dtype=None, enabled=True):
    record("autocast", dtype=dtype, enabled=enabled)
    yield


no_grad = contextlib.nullcontext


class _Optimizer:
    def __init__(self, params, **kwargs):
        self.params = list(params)
        record("optimizer", cls=type(self).__name__, tensors=len(self.params), **{k: v for k, v in kwargs.items() if k != "lr"})

    def step(self):
        for p in self.params:
            assert p.grad is not None, "a stepped tensor without a gradient"

    def zero_grad(self, set_to_none=True):
        record("zero_grad", set_to_none=set_to_none)
        for p in self.params:
            p.grad = None if set_to_none else p.grad


class SGD(_Optimizer):
    pass


class Adam(_Optimizer):
    pass


class AdamW(_Optimizer):
    pass


optim = types.SimpleNamespace(SGD=SGD, Adam=Adam, AdamW=AdamW, Optimizer=_Optimizer)


class GradScaler:
    def __init__(self, device="cuda"):
        record("GradScaler")

    def scale(self, loss):
        return loss

    def step(self, optimizer):
        optimizer.step()

    def update(self):
        pass


amp = types.SimpleNamespace(GradScaler=GradScaler)


class _Cuda:
    OutOfMemoryError = OutOfMemoryError
    memory = types.SimpleNamespace(_record_memory_history=lambda **k: record("record_memory_history", **k),
                                   _dump_snapshot=lambda path: record("dump_snapshot", path=path))

    @staticmethod
    def is_available():
        return True

    @staticmethod
    def synchronize():
        pass

    @staticmethod
    def empty_cache():
        record("empty_cache")

    @staticmethod
    def max_memory_allocated():
        return 3 << 30

    @staticmethod
    def max_memory_reserved():
        return 4 << 30

    @staticmethod
    def reset_peak_memory_stats():
        pass

    @staticmethod
    def get_device_name(index):
        return "Stand-in GPU"

    @staticmethod
    def get_device_properties(index):
        return types.SimpleNamespace(total_memory=80 << 30)


cuda = _Cuda()

import os as _os  # noqa: E402 - what the script set before importing torch

record("environment", **{k: _os.environ.get(k) for k in ("PYTORCH_CUDA_ALLOC_CONF", "CUBLAS_WORKSPACE_CONFIG", "CUDA_MODULE_LOADING")})
