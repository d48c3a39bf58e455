"""torchair's graph-mode entry points vllm-ascend imports by name (patch_for_hcom, CompilerConfig,
get_npu_backend). TorchAir graph mode compiles for the NPU; on a CPU host using them is an error."""


class CompilerConfig:
    def __init__(self) -> None:
        class _Section:
            def __getattr__(self, name):
                return self.__dict__.setdefault(name, _Section())

        self.experimental_config = _Section()
        self.debug = _Section()
        self.dump_config = _Section()


def _unavailable(what: str):
    raise RuntimeError(f"torchair.{what}: TorchAir graph mode needs an Ascend NPU (CPU host; run eager: "
                       f"torchair_graph_config.enabled=False)")


def patch_for_hcom() -> None:
    _unavailable("patch_for_hcom")


def get_npu_backend(compiler_config=None):
    _unavailable("get_npu_backend")
