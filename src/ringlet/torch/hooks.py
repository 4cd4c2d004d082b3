"""Public path of the comm hooks for stock ``torch.nn.parallel.DistributedDataParallel``
(``ringlet.torch.hooks.allreduce_hook``); they live in :mod:`ringlet.torch.training.hooks`."""
from .training.hooks import (BucketState, HookState, allreduce_hook, bf16_compress_hook, compressed_hook,
                             fp16_compress_hook, int8_ef_hook, powersgd_hook, topk_ef_hook)

__all__ = ["HookState", "BucketState", "allreduce_hook", "fp16_compress_hook", "bf16_compress_hook",
           "compressed_hook", "int8_ef_hook", "topk_ef_hook", "powersgd_hook"]
