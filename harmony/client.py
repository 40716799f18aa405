"""Client side of the control plane (used by the CLI and tests)."""
from __future__ import annotations

import hashlib
import os
import time
from typing import Any

import zmq

from harmony.comm import messages as M
from harmony.comm import security
from harmony.comm.handshake import Watch
from harmony.comm.zmqutil import (DEFAULT_MASTER, NoHandshake, check_endpoint, make_socket,
                                  send)
from harmony.store import staging


class ClientError(RuntimeError):
    def __init__(self, message: str, code: str = "error") -> None:
        super().__init__(message)
        self.code = code


def master_address(explicit: str | None = None) -> str:
    return check_endpoint(explicit or os.environ.get("HARMONY_MASTER") or DEFAULT_MASTER)


DEFAULT_KEYS = os.path.join(os.path.expanduser(os.environ.get("HARMONY_HOME", "~/.harmony")),
                            "local", "keys")


def client_keys(keys: "str | security.Keys | None" = None) -> "security.Keys | None":
    """The user's keys: ``keys`` (a dir or Keys), else ``$HARMONY_KEYS``, else
    the default local cluster's; the client key ``$HARMONY_KEY_NAME``
    (default ``admin``), or the read-only ``reader`` key if that is all
    there is. None: no key set found (plain text: only an --insecure master
    answers)."""
    if isinstance(keys, security.Keys):
        return keys
    d = security.resolve_dir(keys, DEFAULT_KEYS)
    if d is None:
        return None
    name = os.environ.get("HARMONY_KEY_NAME", "admin")
    if os.path.isfile(os.path.join(d, "clients", f"{name}.key_secret")):
        return security.Keys.load(d, "client", name)
    if os.path.isfile(os.path.join(d, "readers", f"{name}.key_secret")):
        return security.Keys.load(d, "reader", name)
    return security.Keys.load(d, "reader", "reader")


class Client:
    def __init__(self, master: str | None = None, timeout_s: float | None = None,
                 keys: "str | security.Keys | None" = None, insecure: bool = False) -> None:
        if timeout_s is None:
            timeout_s = float(os.environ.get("HARMONY_CLIENT_TIMEOUT", "10"))
        self.master = master_address(master)
        self.timeout_ms = int(timeout_s * 1000)
        try:
            # insecure: plain text, for a master started with --insecure
            self.insecure = insecure or os.environ.get("HARMONY_INSECURE") == "1"
            self.keys = None if self.insecure else client_keys(keys)
        except security.SecurityError as exc:
            raise ClientError(str(exc), "keys") from None
        self.ctx = zmq.Context()
        self._connect()

    def _connect(self) -> None:
        # send and receive time out: a master that refused the handshake
        # leaves the socket no peer, and a send would otherwise block forever
        self.sock = make_socket(self.ctx, zmq.DEALER, keys=self.keys,
                                timeout_s=self.timeout_ms / 1000)
        self.watch = Watch(self.sock)
        self.sock.connect(self.master)

    def _reconnect(self) -> None:
        """A fresh socket: never read a late reply as the answer to the next
        request."""
        self.watch.close()
        self.sock.close(linger=0)
        self._connect()

    def close(self) -> None:
        self.watch.close()
        self.sock.close(linger=0)
        self.ctx.term()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, mtype: str, expect: str, **fields: Any) -> M.Message:
        try:
            send(self.sock, M.encode(mtype, **fields), "master", self.master)
        except NoHandshake as exc:
            raise self._no_answer(str(exc)) from None
        if not self.sock.poll(self.timeout_ms):
            raise self._no_answer(f"no answer from the master at {self.master} within "
                                  f"{self.timeout_ms / 1000:.0f}s (is it running?)")
        msg = M.decode(self.sock.recv_multipart())
        if msg.type == "error":
            raise ClientError(msg["message"], msg["code"])
        if msg.type != expect:
            raise ClientError(f"unexpected reply {msg.type!r} to {mtype!r}")
        return msg

    def _no_answer(self, why: str) -> ClientError:
        """The error for a request that got no answer (``why``), told more
        exactly where the handshake says more; the socket is replaced."""
        self.watch.update()
        refused, mismatch = self.watch.refused, self.watch.mismatch
        self._reconnect()
        if refused and self.keys is not None:
            pub = os.path.join(self.keys.directory, f"{self.keys.role}s",
                               f"{self.keys.name}.key")
            return ClientError(f"the master at {self.master} refused this key (not in its "
                               f"key set): {self.keys.role} key {self.keys.name!r} ({pub}); "
                               f"use a key of the master's key set (--keys DIR or "
                               f"HARMONY_KEYS)", "refused")
        if self.keys is None and self.insecure:
            why += ("; this client has no key (--insecure or HARMONY_INSECURE=1): a master "
                    "with keys ignores it")
        elif self.keys is None:
            why += ("; no key set found: a master with keys ignores unauthenticated clients; "
                    "pass --keys DIR or set HARMONY_KEYS")
        elif mismatch:
            why += "; the master uses no keys: connect with --insecure (HARMONY_INSECURE=1)"
        return ClientError(why, "unreachable")

    def submit(self, app_name: str, app_source: str, args: list[str], machines: int = 1,
               name: str | None = None, group: str | None = None,
               checkpoint_every: int | None = None,
               checkpoint_seconds: float | None = None) -> str:
        return self.request("submit", "submitted", app_name=app_name, app_source=app_source,
                            args=list(args), machines=machines, name=name, group=group,
                            checkpoint_every=checkpoint_every,
                            checkpoint_seconds=checkpoint_seconds)["job"]

    def jobs(self, all: bool = False) -> list[dict]:
        """The jobs in view (all: also the finished ones past the master's
        retention)."""
        return self.jobs_reply(all)["jobs"]

    def jobs_reply(self, all: bool = False) -> dict:
        return self.request("list_jobs", "jobs", all=all or None)

    def status(self, job: str) -> dict:
        return self.request("job_status", "status", job=job)["job"]

    def cancel(self, job: str) -> dict:
        return self.request("cancel", "ok", job=job).get("info") or {}

    def pause(self, job: str) -> dict:
        return self.request("pause", "ok", job=job).get("info") or {}

    def resume(self, job: str, machines: int | None = None) -> dict:
        return self.request("resume", "ok", job=job, machines=machines).get("info") or {}

    def data_put(self, path: str, name: str, chunk_bytes: int | None = None,
                 progress=None) -> dict:
        """Stage a file into the cluster: line-aligned chunks, each stored on
        two workers (their data services), then recorded by the master."""
        cb = chunk_bytes or staging.CHUNK_BYTES
        staging.check_name(name)
        size = os.path.getsize(path)
        meta = [(i, first, hashlib.sha256(d).digest(), len(d))
                for i, first, d in staging.split_lines(path, cb)]
        holders = self.request("data_plan", "data_placement", name=name, size=size,
                               chunks=len(meta))["holders"]
        sent = 0
        for (i, first, data), hs, (_, first0, sha, n) in zip(staging.split_lines(path, cb),
                                                           holders, meta):
            # the file is read twice (digests first, for the plan): a file that
            # changes in between would be recorded with digests its chunks do
            # not have, and fail every job that reads it
            if first != first0 or len(data) != n or hashlib.sha256(data).digest() != sha:
                raise staging.StagingError(
                    f"{path} changed while it was staged (chunk {i} from line {first0}); "
                    f"nothing was recorded: put it again once it stops changing")
            sent += 1
            for _, endpoint in hs:
                staging.push_chunks(self.ctx, endpoint, name, [(i, data)], keys=self.keys)
            if progress is not None:
                progress(i + 1, len(meta))
        if sent != len(meta) or os.path.getsize(path) != size:
            raise staging.StagingError(f"{path} changed while it was staged (now "
                                       f"{os.path.getsize(path)} bytes, {size} planned); "
                                       f"nothing was recorded: put it again")
        chunks = [{"i": i, "first_line": first, "sha": sha, "size": n,
                   "holders": [h[0] for h in hs]}
                  for (i, first, sha, n), hs in zip(meta, holders)]
        return self.request("data_commit", "ok", name=name, filename=os.path.basename(path),
                            size=size, chunks=chunks).get("info") or {}

    def data_list(self) -> list[dict]:
        return self.request("data_list", "datasets")["datasets"]

    def data_rm(self, name: str) -> dict:
        return self.request("data_rm", "ok", name=name).get("info") or {}

    def resize(self, job: str, machines: int, workers: int | None = None,
               servers: int | None = None) -> dict:
        """Resize a running job; ``workers``/``servers``: its roles (the
        first W machines hold input, the last S the model; default all)."""
        return self.request("resize", "ok", job=job, machines=machines, workers=workers,
                            servers=servers).get("info") or {}

    def dashboard(self) -> dict:
        """The master's dashboard URL and this key's token for it ({} if none)."""
        m = self.request("dashboard_info", "dashboard")
        return {"url": m.get("url"), "token": m.get("token"), "expires": m.get("expires")}

    def log_sources(self, job: str) -> list[tuple[str, str]]:
        """The machines that ran ``job`` and their data services (logs)."""
        return [(m, ep) for m, ep in self.request("log_sources", "log_places",
                                                  job=job)["machines"]]

    def cluster(self) -> dict:
        m = self.request("cluster_info", "cluster")
        return {"workers": m["workers"], "master": m["master"]}

    # -- model export (harmony model get; see harmony/export.py) ----------------------
    def model_source(self, job: str, fresh: bool = False):
        """Where ``job``'s model is (:class:`harmony.export.Source`)."""
        from harmony.export import Source
        return Source.of(self.request("model_parts", "model_source", job=job,
                                      fresh=fresh or None))

    def model(self, job: str, fresh: bool | None = None, inputs: bool = True,
              wait_s: float = 3600.0, poll_s: float = 0.2, app_file: str | None = None,
              trust_app: bool = False):
        """Fetch ``job``'s model (:class:`harmony.export.Model`): a finished
        job's final checkpoint; a paused one's pause checkpoint; a running
        one's ``fresh`` snapshot (default for a running job: it checkpoints
        at its next epoch end, and this waits up to ``wait_s`` for it), or
        with ``fresh=False`` its latest complete checkpoint. ``inputs``:
        also the input blocks, for an app that exports input state. The
        job's app code runs here only as :func:`harmony.export.vouch`
        allows: a bundled app, the caller's ``app_file`` (the same code), or
        ``trust_app``."""
        from harmony import export as X
        src = self.model_source(job, fresh=fresh is not False)
        if src.pending and fresh is not False:
            after, deadline = src.epoch, time.monotonic() + wait_s
            while src.epoch <= after and src.state in X.ACTIVE + ("waiting",):
                if time.monotonic() > deadline:
                    raise ClientError(f"{job} wrote no new checkpoint within {wait_s:.0f}s "
                                      f"(it is {src.state}); 'harmony model get {job} "
                                      f"--latest' takes its last one", "timeout")
                time.sleep(poll_s)
                src = self.model_source(job)
        for attempt in range(3):
            if src.epoch < 0 or not src.parts:
                hint = (f"; it checkpoints every few epochs, or ask for a fresh snapshot "
                        f"(without --latest)" if src.state in X.ACTIVE else "")
                raise ClientError(f"{job} has no checkpoint yet (it is {src.state}){hint}",
                                  "no_checkpoint")
            try:
                src = X.vouch(src, app_file, trust_app)
            except X.ExportError as exc:
                raise ClientError(str(exc), "untrusted_app") from None
            try:
                cls, _ = X.app_of(src)
                return X.fetch(self.ctx, src, inputs=inputs and X.wants_inputs(cls),
                               auth=self.keys)
            except X.ExportError as exc:
                # a running job may have replaced that checkpoint meanwhile
                if attempt == 2 or src.state not in X.ACTIVE:
                    raise ClientError(str(exc), "no_model") from None
                src = self.model_source(job)
        raise AssertionError("unreachable")
