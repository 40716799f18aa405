"""Client side of the control plane (used by the CLI and tests)."""
from __future__ import annotations

import os
from typing import Any

import zmq

from harmony.comm import messages as M
from harmony.comm.zmqutil import DEFAULT_MASTER, check_endpoint, make_socket


class ClientError(RuntimeError):
    def __init__(self, message: str, code: str = "error") -> None:
        super().__init__(message)
        self.code = code


def master_address(explicit: str | None = None) -> str:
    return check_endpoint(explicit or os.environ.get("HARMONY_MASTER") or DEFAULT_MASTER)


class Client:
    def __init__(self, master: str | None = None, timeout_s: float | None = None) -> None:
        if timeout_s is None:
            timeout_s = float(os.environ.get("HARMONY_CLIENT_TIMEOUT", "10"))
        self.master = master_address(master)
        self.timeout_ms = int(timeout_s * 1000)
        self.ctx = zmq.Context()
        self.sock = make_socket(self.ctx, zmq.DEALER)
        self.sock.connect(self.master)

    def close(self) -> None:
        self.sock.close(linger=0)
        self.ctx.term()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, mtype: str, expect: str, **fields: Any) -> M.Message:
        self.sock.send(M.encode(mtype, **fields))
        if not self.sock.poll(self.timeout_ms):
            # a fresh socket: never read a late reply as the answer to the next request
            self.sock.close(linger=0)
            self.sock = make_socket(self.ctx, zmq.DEALER)
            self.sock.connect(self.master)
            raise ClientError(f"no answer from the master at {self.master} within "
                              f"{self.timeout_ms / 1000:.0f}s (is it running?)", "unreachable")
        msg = M.decode(self.sock.recv_multipart())
        if msg.type == "error":
            raise ClientError(msg["message"], msg["code"])
        if msg.type != expect:
            raise ClientError(f"unexpected reply {msg.type!r} to {mtype!r}")
        return msg

    def submit(self, app_name: str, app_source: str, args: list[str], machines: int = 1,
               name: str | None = None, group: str | None = None,
               checkpoint_every: int | None = None,
               checkpoint_seconds: float | None = None) -> str:
        return self.request("submit", "submitted", app_name=app_name, app_source=app_source,
                            args=list(args), machines=machines, name=name, group=group,
                            checkpoint_every=checkpoint_every,
                            checkpoint_seconds=checkpoint_seconds)["job"]

    def jobs(self) -> list[dict]:
        return self.request("list_jobs", "jobs")["jobs"]

    def status(self, job: str) -> dict:
        return self.request("job_status", "status", job=job)["job"]

    def cancel(self, job: str) -> dict:
        return self.request("cancel", "ok", job=job).get("info") or {}

    def pause(self, job: str) -> dict:
        return self.request("pause", "ok", job=job).get("info") or {}

    def resume(self, job: str, machines: int | None = None) -> dict:
        return self.request("resume", "ok", job=job, machines=machines).get("info") or {}

    def resize(self, job: str, machines: int) -> dict:
        return self.request("resize", "ok", job=job, machines=machines).get("info") or {}

    def cluster(self) -> dict:
        m = self.request("cluster_info", "cluster")
        return {"workers": m["workers"], "master": m["master"]}
