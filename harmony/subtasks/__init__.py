"""The ground floor shared by the runtime and its models: the per-resource
subtask queues (:mod:`harmony.subtasks.queues`), a pure state machine that
the worker daemon runs, and that the scheduler's queue replay and the
simulator run too. It imports nothing of Harmony's."""
