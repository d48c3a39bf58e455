"""HCCL process-group option types; on a CPU host the collectives run over gloo."""


class ProcessGroupHCCL:
    class Options:
        def __init__(self) -> None:
            self.hccl_config: dict = {}
            self._timeout = None
            self.global_ranks_in_group: list = []
            self.group_id = ""
