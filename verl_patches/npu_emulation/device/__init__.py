"""The "npu" device on a CPU host: a small C++ extension (`npu_device.cpp`, built and loaded by `build`) that
makes PyTorch's privateuse1 backend, renamed "npu", a real device whose memory is host memory.

CPU hosts only: the stand-in torch_npu (`site/`, on sys.path only on a CPU host) loads it when imported; on
A3 the real torch_npu owns the npu device and nothing here is built or loaded. With it, `torch.zeros(3,
device="npu:0")`, `t.to("npu")`, views, in-place ops, `torch.compile` tracing (FakeTensors of device npu)
and torch.distributed collectives (gloo underneath) work on npu tensors: every op runs the CPU kernel over
the same memory. There is one stream per device, events record nothing, and the RNG is the host's.
"""
