"""The retraining loop: retrain requests -> data set -> LoRA (PEFT) -> gate -> registry -> vLLM canary.

Modules, one job each: ``jobs`` (one job per trigger key, crash resume), ``dataset`` (corrections +
replay, digest), ``trainer`` (LoRA), ``gate`` (regression suite + held-out loss), ``registry``
(write-once adapter store + ClickHouse index), ``publisher`` (runtime LoRA load, canary, rollback),
``pipeline`` (the job's steps wired), ``actions`` (Action records of every step).

Nothing here imports torch at module level: the CLI lists these commands in the light virtualenv.
"""
