"""One small result type for plugin outcomes, as in Gödel and kube-scheduler."""

import enum
from dataclasses import dataclass, field


class Code(enum.IntEnum):
    SUCCESS = 0
    UNSCHEDULABLE = 1  # may fit after preemption or a cluster change
    UNRESOLVABLE = 2  # preemption cannot help (e.g. a node selector matches nothing)
    ERROR = 3
    SKIP = 4  # the plugin has nothing to say about this task


@dataclass(frozen=True, slots=True)
class Status:
    code: Code = Code.SUCCESS
    reasons: tuple[str, ...] = field(default=())
    plugin: str = ""

    @property
    def ok(self) -> bool:
        return self.code in (Code.SUCCESS, Code.SKIP)

    @classmethod
    def success(cls) -> "Status":
        return _SUCCESS

    @classmethod
    def unschedulable(cls, plugin: str, *reasons: str) -> "Status":
        return cls(Code.UNSCHEDULABLE, reasons, plugin)

    @classmethod
    def unresolvable(cls, plugin: str, *reasons: str) -> "Status":
        return cls(Code.UNRESOLVABLE, reasons, plugin)

    def message(self) -> str:
        return f"{self.plugin}: {'; '.join(self.reasons)}" if self.reasons else self.plugin


_SUCCESS = Status()
