"""The job executor: one process per (job, machine).

It holds the job's worker role on this machine (input blocks, the app's
compute) and its PS server shard (a thread serving this machine's model
blocks). The master synchronizes iterations across the job's machines.
Started by the worker daemon as ``python -m harmony.worker.executor SPEC``.

Input blocks live in a :class:`~harmony.store.local.LocalInput` backed by the
job's LMDB store under the worker's state dir (``STATE/store/JOB``). A
fraction α of them are disk-blocks, reloaded in the background during each
pass of the app over its blocks. α is fixed (``--disk-ratio``) or starts from
an estimate of input and model size against this job's part of the machine's
memory budget and is hill-climbed per epoch
(:class:`~harmony.store.alpha.AlphaController`) from the measured reload
stall and memory pressure. When α is 1 and memory is still short, the model
shard is spilled during COMP too.

One module per responsibility; :class:`Executor` is composed of one mixin
per module, each deriving only from those below it:

```
 process.py      Executor: its state, run() (the process's life), close();
                 main(), the entry point (__main__.py)
 training.py     the training loop: iterations as subtasks, the epoch
                 boundary (epoch_done, epoch_sums: stop, checkpoint, pause,
                 resize)
 layout.py       start, join, resize: the owner map, block moves
 checkpoints.py  checkpoint parts: periodic, a pause's, final; replicas
 memory.py       the machine's memory, the job's block store, the disk ratio α
 links.py        the sockets to the master and the daemon: messages, waits,
                 barriers, subtask slots (sync, grant, sub_done)
```

What an executor does with the master's ``epoch_sums`` answer (stop,
pause, checkpoint, resize) is the pure core's
(:mod:`harmony.worker.executor_core`), which the simulator's executor
drives too.
"""
from harmony.worker.executor.checkpoints import CKPT_ERRORS
from harmony.worker.executor.layout import Left
from harmony.worker.executor.links import MASTER_TIMEOUT_S, PING_AFTER_S, Aborted, MasterLost
from harmony.worker.executor.memory import THRESHOLDS, MachineMemory
from harmony.worker.executor.process import Executor, main
from harmony.worker.executor.training import Paused

__all__ = ["Aborted", "CKPT_ERRORS", "Executor", "Left", "MASTER_TIMEOUT_S", "MachineMemory",
           "MasterLost", "PING_AFTER_S", "Paused", "THRESHOLDS", "main"]
