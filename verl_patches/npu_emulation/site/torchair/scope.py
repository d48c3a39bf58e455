"""torchair.scope on a CPU host (vllm-ascend imports it): graph-mode scopes are no-ops in eager CPU code."""

import contextlib


@contextlib.contextmanager
def super_kernel(scope=None, options=None, *args, **kwargs):
    yield


@contextlib.contextmanager
def npu_stream_switch(tag=None, priority=0, *args, **kwargs):
    yield


def npu_wait_tensor(tensor, dependency=None, *args, **kwargs):
    return tensor
