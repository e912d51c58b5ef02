"""The runtime: run optpipe schedules as real pipeline-parallel training with torch.

``OptPipeRunner`` executes any valid :class:`~optpipe.schedule.Schedule` (F, split B/W,
fused BW, OFFLOAD, RELOAD) on gloo (CPU) or NCCL (GPU), or in one process holding every
stage; :mod:`optpipe.runtime.profile` measures a model into a
:class:`~optpipe.problem.Problem`; :mod:`optpipe.runtime.launch` starts the processes of
``optpipe run``. See docs/runtime.md.
"""

from __future__ import annotations

from optpipe._lazy import lazy_exports

_EXPORTS = {
    "OptPipeRunner": "optpipe.runtime.runner",
    "check_runnable": "optpipe.runtime.runner",
    "StepRecord": "optpipe.runtime.record",
    "PipelineParts": "optpipe.runtime.partition",
    "StageModule": "optpipe.runtime.partition",
    "split_model": "optpipe.runtime.partition",
    "balanced_partition": "optpipe.runtime.partition",
    "GPT": "optpipe.runtime.model_gpt",
    "GPTConfig": "optpipe.runtime.model_gpt",
    "gpt_loss": "optpipe.runtime.model_gpt",
    "gpt_batch": "optpipe.runtime.model_gpt",
    "mlp_model": "optpipe.runtime.model_mlp",
    "mse_loss": "optpipe.runtime.model_mlp",
    "mlp_batch": "optpipe.runtime.model_mlp",
    "profile_model": "optpipe.runtime.profile",
}


__getattr__ = lazy_exports("optpipe.runtime", _EXPORTS)

__all__ = sorted(_EXPORTS)
