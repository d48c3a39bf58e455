"""HCCL process-group option types; on a CPU host the collectives run over gloo."""


class ProcessGroupHCCL:
    class Options:
        # The fields torch_npu 2.5.1.post1 binds on the class (pybind def_readwrite: libtorch_npu.so), so they are
        # attributes of the class itself as there: MindSpeed and MindSpeed-LLM probe
        # hasattr(ProcessGroupHCCL.Options, "hccl_config") to name their groups.
        hccl_config: dict | None = None
        is_high_priority_stream: bool = False
        global_ranks_in_group: list | None = None
        group_id: str = ""
        _timeout = None

        def __init__(self) -> None:
            self.hccl_config = {}
            self._timeout = None
            self.global_ranks_in_group = []
            self.group_id = ""
