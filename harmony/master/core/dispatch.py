"""The message table: every message type the master accepts, the component
method that handles it and the roles whose keys may send it (with keys:
``secure``). A type not in the table is answered ``unexpected``, a role not
allowed ``forbidden``, a handler's exception ``internal``; the master goes on."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from harmony.comm import messages as M
from harmony.master.core.catalog import Catalog
from harmony.master.core.checkpoints import Checkpoints
from harmony.master.core.clients import Clients
from harmony.master.core.daemons import Daemons
from harmony.master.core.executors import Executors
from harmony.master.core.protocol import Received, _err
from harmony.master.core.resize import Resize
from harmony.master.core.state import CoreState, log

CLIENT = frozenset({"client"})              # changes: a client's key only
READER = frozenset({"client", "reader"})    # reads: a reader's key too
WORKER = frozenset({"worker"})              # daemons, and executors (their daemon's key)


class Route(NamedTuple):
    handler: Callable[[Any, bytes, M.Message], None]    # (core, sender, message)
    roles: frozenset[str]
    own_name: bool = False     # with keys: the message's "name" is the key's own name


MESSAGES: dict[str, Route] = {
    # clients: harmony submit, jobs, status, cancel, pause, resume, resize, model get
    "submit": Route(Clients._on_submit, CLIENT),
    "list_jobs": Route(Clients._on_list_jobs, READER),
    "job_status": Route(Clients._on_job_status, READER),
    "cluster_info": Route(Clients._on_cluster_info, READER),
    "cancel": Route(Clients._on_cancel, CLIENT),
    "pause": Route(Clients._on_pause, CLIENT),
    "resume": Route(Clients._on_resume, CLIENT),
    "resize": Route(Resize._on_resize, CLIENT),
    "model_parts": Route(Checkpoints._on_model_parts, CLIENT),
    # the data catalog: harmony data put, ls, rm; a daemon's re-replication
    "data_plan": Route(Catalog._on_data_plan, CLIENT),
    "data_commit": Route(Catalog._on_data_commit, CLIENT),
    "data_list": Route(Catalog._on_data_list, READER),
    "data_rm": Route(Catalog._on_data_rm, CLIENT),
    "data_copied": Route(Catalog._on_data_copied, WORKER),
    # worker daemons
    "register": Route(Daemons._on_register, WORKER, own_name=True),
    "heartbeat": Route(Daemons._on_heartbeat, WORKER),
    "exec_exited": Route(Daemons._on_exec_exited, WORKER),
    "sync_failed": Route(Executors._on_sync_failed, WORKER),
    # job executors
    "exec_ready": Route(Executors._on_exec_ready, WORKER),
    "barrier": Route(Executors._on_barrier, WORKER),
    "sync": Route(Executors._on_sync, WORKER),
    "epoch_done": Route(Executors._on_epoch_done, WORKER),
    "epoch_report": Route(Executors._on_epoch_report, WORKER),
    "ping": Route(Executors._on_ping, WORKER),
    "exec_paused": Route(Executors._on_exec_paused, WORKER),
    "exec_failed": Route(Executors._on_exec_failed, WORKER),
    "exec_finished": Route(Executors._on_exec_finished, WORKER),
    "ckpt_part": Route(Checkpoints._on_ckpt_part, WORKER),
    "ckpt_final": Route(Checkpoints._on_ckpt_final, WORKER),
    "at_boundary": Route(Resize._on_at_boundary, WORKER),
    "moved": Route(Resize._on_moved, WORKER),
    "migrating": Route(Resize._on_migrating, WORKER),
    "migrated": Route(Resize._on_migrated, WORKER),
}


class Dispatch(CoreState):
    def _dispatch(self, ev: Received) -> None:
        ident, msg = ev.ident, ev.msg
        route = MESSAGES.get(msg.type)
        if route is None:
            self.bad_messages += 1
            self._send(ident, _err("unexpected", f"the master does not accept {msg.type!r}"))
            return
        handler, roles, own_name = route
        self._peer = ("", "")
        if self.secure:
            self._peer = role, name = ev.role, ev.name
            allowed = role in roles
            if own_name and name != msg["name"]:
                allowed = False
            if not allowed:
                self.bad_messages += 1
                log.warning("%s refused from %s %r", msg.type, role or "an unknown key", name)
                self._send(ident, _err("forbidden", f"{msg.type!r} is not allowed for "
                                                    f"this key"))
                return
        try:
            handler(self, ident, msg)
        except Exception as exc:  # a handler bug must not kill the master
            log.exception("error handling %s", msg.type)
            self._send(ident, _err("internal", f"{exc.__class__.__name__}: {exc}"))
