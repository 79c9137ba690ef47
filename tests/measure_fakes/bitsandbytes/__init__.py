import types

import torch


class Adam8bit(torch._Optimizer):
    pass


class AdamW8bit(torch._Optimizer):
    pass


class PagedAdamW(torch._Optimizer):
    pass


class PagedAdamW8bit(torch._Optimizer):
    pass


optim = types.SimpleNamespace(Adam8bit=Adam8bit, AdamW8bit=AdamW8bit, PagedAdamW=PagedAdamW, PagedAdamW8bit=PagedAdamW8bit)
