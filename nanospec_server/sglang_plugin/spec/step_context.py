"""The state NanoSpec's hooks share within one scheduler process, looked up in one place.

SGLang calls our hooks with its own arguments only, so they cannot be handed this object;
each looks it up with `current()`. The draft worker sets the runtime when it builds its LM
head, adaptive speculation its state once the worker's graphs exist, the scheduler hooks
the scheduler as it starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nanospec_server.sglang_plugin.spec.adaptive import AdaptiveState
    from nanospec_server.sglang_plugin.spec.runtime import NanoSpecRuntime


@dataclass
class StepContext:
    runtime: NanoSpecRuntime | None = None  # None: this process runs no NanoSpec draft worker
    adaptive: AdaptiveState | None = None  # None: no speculative worker installed yet
    scheduler: object | None = None  # SGLang's Scheduler (its waiting queue), once built


_CONTEXT = StepContext()


def current() -> StepContext:
    """This scheduler process's context."""
    return _CONTEXT
