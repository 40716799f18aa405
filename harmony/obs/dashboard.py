"""The master's web dashboard and Prometheus endpoint.

An HTTP server in a daemon thread of the master process. It never touches
the master's objects: the master's loop publishes a snapshot (a plain dict,
:func:`harmony.obs.snapshot.build_snapshot`) at most once a second
(:meth:`ObsServer.tick`), and the server answers from the latest one:

* ``/``, ``/static/...``: one HTML page with a small vanilla JS file that
  polls ``/api/snapshot`` every second and draws its tables and SVG charts
  (no build step, no third-party JS);
* ``/api/snapshot``: the snapshot as JSON;
* ``/api/logs?job=ID&offsets=...``: the job's executor logs from its
  machines' data services, after the offsets the page has (the job page
  polls it while open); fetched by the HTTP thread itself, never by the
  master's loop, which only says which machines to ask (:meth:`ObsServer.logs`);
* ``/metrics``: Prometheus exposition format (:mod:`harmony.obs.metrics`).

Bound to 127.0.0.1 unless configured. With a key set (every secure
cluster), every path but ``/healthz`` needs a token: HMAC-SHA256 of a fixed
label and the client's key name under the cluster's secret key, which the
master hands only to an authenticated client or reader key
(``harmony dashboard``); as ``?token=``, an ``Authorization: Bearer``
header, or the cookie the page sets. A key removed from the set loses its
token with it. Before any token is looked at, the server caps its
connections and gives each request a few seconds for its head
(:mod:`harmony.obs.httpserver`): half-open connections cannot hold the
master's threads and file descriptors.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from harmony.obs import logs as OL
from harmony.obs import metrics as OM
from harmony.obs.httpserver import BoundedHandler, BoundedHTTPServer
from harmony.obs.snapshot import SnapshotEncoder, build_snapshot
from harmony.util import names

log = logging.getLogger("harmony.obs")

STATIC = Path(__file__).resolve().parent / "static"
LABEL = b"harmony-dashboard-v1"
#: s between snapshots: the master's loop builds one at most this often (on its
#: ticks, never per fetch); readers get the latest, at most this old
PUBLISH_EVERY = 1.0
#: the task stream is collected while a snapshot was fetched this recently
WATCHED_S = 30.0
_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8", ".png": "image/png", ".svg": "image/svg+xml"}


#: how long a dashboard token is good for (`harmony dashboard` gets a new one)
TOKEN_TTL = 30 * 86400

#: the job page's logs (``/api/logs``): the reader key of the master's key
#: set it reads them with (the data services serve logs to client and reader
#: keys only, and the master's own key is the cluster's, which every worker
#: and executor holds too); bytes per machine per request; the seconds all
#: the machines together have to answer; the machines asked per request; the
#: requests fetching at once (more wait, then get a 503); how long the loop's
#: list of machines is reused
LOG_READER = "dashboard"
LOG_CHUNK = 64 * 1024
LOG_TIMEOUT = 2.0
LOG_MACHINES = 16
LOG_FETCHES = 4
LOG_PLACES_S = 5.0


def token_for(secret: bytes, role: str, name: str, expires: int) -> str:
    """The dashboard token of the client or reader key ``role``/``name``,
    good until ``expires`` (unix seconds): ``EXPIRES.ROLE.NAME.MAC``, MAC an
    HMAC-SHA256 under the master's own dashboard secret (``secret_of``)."""
    mac = hmac.new(secret, LABEL + f":{role}:{name}:{int(expires)}".encode(),
                   hashlib.sha256).hexdigest()[:40]
    return f"{int(expires)}.{role}.{name}.{mac}"


def secret_of(state_dir: str | None) -> bytes:
    """The master's dashboard secret: ``STATE/dashboard.secret`` (made at
    its first start, mode 0600), so that tokens outlive a restart; random
    per process without a state dir. The workers do not have it: a worker
    key cannot mint a token (they hold the cluster's key pair, which the
    tokens were made under before)."""
    if not state_dir:
        return os.urandom(32)
    path = os.path.join(state_dir, "dashboard.secret")
    try:
        with open(path, "rb") as fh:
            data = fh.read()
        if len(data) == 32:
            return data
    except OSError:
        pass
    data = os.urandom(32)
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)
    return data


class ObsServer:
    def __init__(self, host: str, port: int, keys=None, state_dir: str | None = None) -> None:
        self.keys = keys
        self.secret = secret_of(state_dir) if keys is not None else b""
        self.collector = OM.SnapshotCollector()
        self.registry = OM.make_registry(self.collector)
        self._snap: dict[str, Any] | None = None
        self._json: tuple[Any, bytes] = (None, b"{}")   # (a snapshot, its JSON)
        self._encoder = SnapshotEncoder()       # the HTTP threads', under _encoding
        self._encoding = threading.Lock()
        self._last = 0.0
        self.fetched = 0.0          # when a snapshot was last fetched (the task stream)
        # the master's dashboard_request (cancel, pause, resume; the machines
        # that hold a job's logs), if it has one
        self.control = None
        # the job page's logs: the key they are read with (None: this master
        # has none, log_why says why; not needed without keys), a ZeroMQ
        # context of the HTTP threads' own, and the fetches under way
        self.log_keys = None
        self.log_why = "" if keys is None else "this master has no key to read logs with"
        self._log_ctx = None
        self._log_slots = threading.BoundedSemaphore(LOG_FETCHES)
        self._log_lock = threading.Lock()
        self._log_places: dict[str, tuple[float, list]] = {}
        obs = self

        class Handler(_Handler):
            server_obs = obs
        # bounded: a connection cap and a deadline for the request head, both
        # before the token check (harmony.obs.httpserver)
        self.httpd = BoundedHTTPServer((host, port), Handler)
        self.host, self.port = host, self.httpd.server_address[1]
        wildcard = host in ("0.0.0.0", "", "::")
        # bound to every address: the URL names this machine, as others reach it
        shown = (socket.getfqdn() or socket.gethostname()) if wildcard else host
        self.url = f"http://{'[' + shown + ']' if ':' in shown else shown}:{self.port}/"
        if host not in ("127.0.0.1", "localhost", "::1"):
            log.warning("the dashboard serves plain HTTP on %s:%s: its tokens and pages cross "
                        "the network unencrypted; put a TLS proxy in front of it, or keep "
                        "--dashboard-host 127.0.0.1 and use an SSH tunnel", host or "*",
                        self.port)
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="obs-http",
                                       kwargs={"poll_interval": 0.5}, daemon=True)
        self.path = os.path.join(state_dir, "dashboard.json") if state_dir else None
        if self.path:
            tmp = f"{self.path}.{os.getpid()}.tmp"
            with open(tmp, "w") as fh:
                json.dump({"url": self.url, "pid": os.getpid(), "secure": keys is not None}, fh)
            os.replace(tmp, self.path)

    # -- the master's side (its own thread) ------------------------------------------
    def start(self) -> "ObsServer":
        self.thread.start()
        log.info("dashboard and /metrics on %s%s", self.url,
                 " (token: 'harmony dashboard')" if self.keys is not None else "")
        return self

    def tick(self, master, now: float | None = None) -> None:
        """Publish the master's snapshot, at most once every PUBLISH_EVERY s."""
        now = time.time() if now is None else now
        if now - self._last < PUBLISH_EVERY:
            return
        self._last = now
        # someone fetched a snapshot lately: the daemons send their subtasks
        # for the task stream (no cost to anyone while no one watches)
        core = getattr(master, "core", master)
        if hasattr(core, "task_stream"):
            core.task_stream = now - self.fetched < WATCHED_S
        try:
            self.publish(build_snapshot(master))
        except Exception:       # the dashboard must never stop the master
            log.exception("snapshot failed")

    def publish(self, snap: dict[str, Any]) -> None:
        self.collector.observe(snap)
        self._snap = snap         # encoded on demand, in the HTTP thread

    def info(self, role: str, name: str) -> dict[str, Any]:
        """The URL, and the token of the asking key (``dashboard_info``)."""
        tok = expires = None
        if self.keys is not None and role:
            expires = int(time.time()) + TOKEN_TTL
            tok = token_for(self.secret, role, name, expires)
        return {"url": self.url, "token": tok, "expires": expires}

    def stop(self) -> None:
        try:
            self.httpd.shutdown()
            self.httpd.server_close()
        except Exception:
            pass
        if self._log_ctx is not None:       # a fetch under way closes its sockets
            self._log_ctx.term()            # within LOG_TIMEOUT (linger 0)
        if self.path:
            try:
                os.unlink(self.path)
            except OSError:
                pass

    # -- the HTTP thread -------------------------------------------------------------
    def snapshot_json(self) -> bytes:
        """The latest snapshot as JSON, encoded once per snapshot (the first
        fetch after a publish), in pieces (:class:`SnapshotEncoder`: the
        master's loop is not held up for the whole encoding)."""
        self.fetched = time.time()
        snap, (of, data) = self._snap, self._json
        if of is snap and data:
            return data
        with self._encoding:            # one encoder; a second fetch waits for it
            snap, (of, data) = self._snap, self._json
            if of is not snap or not data:
                data = (self._encoder.encode(snap) if snap is not None
                        else json.dumps({"t": None, "jobs": []}).encode())
                self._json = (snap, data)   # the snapshot it encodes goes with it
        return data

    def logs(self, job: str, have: dict[str, tuple[str | None, int]], role: str,
             name: str) -> tuple[int, dict[str, Any]]:
        """(HTTP status, JSON body) of ``/api/logs``: what ``job``'s logs hold
        after what the page has (``have``: machine -> [log name, byte
        offset]; a machine not in it: about its last LOG_CHUNK bytes, from a
        line's start). The master's loop only names the live machines'
        data services (``log_sources``, for this token's key, reused for
        LOG_PLACES_S); this thread asks them itself, at most LOG_MACHINES
        (the job's own first, then those the page follows), LOG_CHUNK bytes
        each, all within LOG_TIMEOUT: a dead machine is reported, not
        waited for. Per machine in ``machines``: its log's name, whether it
        is still written, ``offset`` (where ``text`` starts), ``next`` (the
        offset to ask from next), ``size``; ``restart`` when the page's log
        there was replaced by a newer attempt's (ask again from 0); or
        ``error``. ``quiet``: the machines asked that hold no log of it."""
        if self.keys is not None and self.log_keys is None:
            return 503, {"ok": False, "error": self.log_why}
        if self.control is None:
            return 503, {"ok": False, "error": "this master serves no logs here"}
        if not self._log_slots.acquire(timeout=LOG_TIMEOUT):
            return 503, {"ok": False, "error": "too many log requests at once; try again"}
        try:
            places = self._places_of(job, role, name)
            if isinstance(places, tuple):
                return places
            mine = []
            for j in (self._snap or {}).get("jobs", []):
                if j.get("id") == job:
                    mine = list(j.get("workers") or [])
            rank = {m: i for i, m in enumerate(dict.fromkeys([*mine, *have]))}
            places = sorted(places, key=lambda p: (rank.get(p[0], len(rank)), p[0]))
            asked = places[:LOG_MACHINES]
            asks = []
            for machine, endpoint in asked:
                logname, offset = have.get(machine, (None, -1))
                asks.append((machine, endpoint, offset if logname else -LOG_CHUNK))
            if self._log_ctx is None:
                with self._log_lock:
                    if self._log_ctx is None:
                        import zmq
                        self._log_ctx = zmq.Context()
            got = OL.fetch_many(self._log_ctx, asks, job, keys=self.log_keys,
                                timeout_s=LOG_TIMEOUT, max_bytes=LOG_CHUNK)
        finally:
            self._log_slots.release()
        out, quiet = [], []
        for machine, _ in asked:
            d = got[machine]
            if "error" in d:
                out.append({"machine": machine, "error": str(d["error"])[:300]})
                continue
            if not d.get("attempts"):
                quiet.append(machine)
                continue
            try:
                logname = str(d["attempts"][d["attempt"]][0])
                text = d["text"][:LOG_CHUNK]        # what was asked for, at most
                entry = {"machine": machine, "name": logname, "live": bool(d["live"]),
                         "size": int(d["size"]), "offset": int(d["offset"])}
            except (KeyError, IndexError, TypeError, ValueError):
                out.append({"machine": machine, "error": "a malformed answer"})
                continue
            had, at = have.get(machine, (None, -1))
            if had is not None and had != logname and at > 0:
                # the page's log here gave way to a newer attempt's: its bytes
                # at that offset are not what follows; from 0, next time
                entry.update(restart=True, offset=0, next=0, text="")
            else:
                entry.update(next=entry["offset"] + len(text.encode("utf-8", "replace")),
                             text=text)
            out.append(entry)
        return 200, {"ok": True, "job": job, "t": time.time(), "machines": out,
                     "quiet": quiet, "left_out": max(0, len(places) - len(asked))}

    def _places_of(self, job: str, role: str, name: str):
        """The live machines' data services ([[machine, endpoint]]) from the
        master's loop, reused for LOG_PLACES_S; or (status, body) if it
        refuses (an unknown job: 404)."""
        now = time.monotonic()
        with self._log_lock:
            hit = self._log_places.get(job)
        if hit is not None and now - hit[0] < LOG_PLACES_S:
            return hit[1]
        try:
            reply = self.control("log_sources", {"job": job}, role, name)
        except (TimeoutError, ValueError) as exc:
            return 503, {"ok": False, "error": str(exc)}
        if reply.type == "error":
            code = {"unknown_job": 404, "forbidden": 403}.get(reply["code"], 409)
            return code, {"ok": False, "error": reply["message"], "code": reply["code"]}
        places = [(str(m), str(ep)) for m, ep in reply["machines"]]
        with self._log_lock:
            if len(self._log_places) > 256:
                self._log_places.clear()
            self._log_places[job] = (now, places)
        return places

    def allowed(self, token: str | None, now: float | None = None) -> bool:
        """A token of a client or reader key that the key set still holds,
        made under this master's secret, and not expired."""
        if self.keys is None:
            return True
        if not token or len(token) > 512:
            return False
        try:
            expires, role, rest = token.split(".", 2)
            name, _ = rest.rsplit(".", 1)
            expires_at = int(expires)
        except ValueError:
            return False
        if expires_at < (time.time() if now is None else now) or role not in ("client", "reader") \
                or (role, name) not in set(self.keys.known.values()):
            return False
        return hmac.compare_digest(token, token_for(self.secret, role, name, expires_at))

    def identity(self, token: str | None) -> tuple[str, str] | None:
        """(role, name) of an allowed token's key; ("", "") without keys."""
        if not self.allowed(token):
            return None
        if self.keys is None:
            return "", ""
        _, role, rest = token.split(".", 2)         # type: ignore[union-attr]
        return role, rest.rsplit(".", 1)[0]


#: what the dashboard's buttons may ask (the message types of the CLI's commands)
CONTROLS = frozenset({"cancel", "pause", "resume"})
#: a header a cross-site form cannot send (a cross-origin fetch that sends it
#: needs a CORS preflight, which this server never grants): with the cookie's
#: SameSite=Strict, no other site can press the buttons
CONTROL_HEADER = "X-Harmony-Dashboard"


class _Handler(BoundedHandler):
    server_obs: ObsServer
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt: str, *args: Any) -> None:   # quiet: no line per poll
        log.debug("http %s", fmt % args)

    def _token(self, query: dict) -> str | None:
        if "token" in query:
            return query["token"][0]
        auth = self.headers.get("Authorization", "")
        if auth.lower().startswith("bearer "):
            return auth[7:].strip()
        for part in self.headers.get("Cookie", "").split(";"):
            k, _, v = part.strip().partition("=")
            if k == "harmony_token":
                return v
        return None

    def _send(self, code: int, body: bytes, ctype: str, extra: dict | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Security-Policy",
                         "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' "
                         "data:")
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        obs = self.server_obs
        url = urlsplit(self.path)
        path = url.path
        if path == "/healthz":
            return self._send(200, b"ok\n", "text/plain")
        query = parse_qs(url.query)
        token = self._token(query)
        if not obs.allowed(token):
            return self._send(401, b"a token is needed: 'harmony dashboard' prints the URL "
                                   b"with yours\n", "text/plain; charset=utf-8",
                              {"WWW-Authenticate": 'Bearer realm="harmony"'})
        extra = {}
        if "token" in query and obs.keys is not None:
            extra["Set-Cookie"] = (f"harmony_token={token}; Path=/; HttpOnly; "
                                   f"SameSite=Strict")
        if path in ("/", "/index.html"):
            return self._file("index.html", extra)
        if path.startswith("/static/"):
            return self._file(path[len("/static/"):], extra)
        if path == "/api/snapshot":
            return self._send(200, obs.snapshot_json(), "application/json", extra)
        if path == "/metrics":
            return self._send(200, OM.exposition(obs.registry), OM.CONTENT_TYPE, extra)
        if path == "/api/logs":
            return self._logs(query, token)
        self._send(404, b"not found\n", "text/plain")

    def _logs(self, query: dict, token: str | None) -> None:
        """``GET /api/logs?job=ID&offsets={"MACHINE": ["LOG", BYTES], ...}``
        (:meth:`ObsServer.logs`), for the token's key."""
        job = (query.get("job") or [""])[0]
        if not names.NAME_RE.fullmatch(job):
            return self._json(400, {"ok": False, "error": "job= must name a job (job-0001)"})
        have = _offsets((query.get("offsets") or ["{}"])[0])
        if have is None:
            return self._json(400, {"ok": False, "error": 'offsets= must be JSON: {"MACHINE": '
                                                          '["LOG", BYTES], ...}'})
        who = self.server_obs.identity(token) or ("", "")
        code, body = self.server_obs.logs(job, have, *who)
        self._json(code, body)

    def do_POST(self) -> None:
        """``POST /api/control?action=cancel|pause|resume&job=ID``: what
        ``harmony cancel|pause|resume`` do, on behalf of the token's key (a
        reader's is refused by the master, as from the CLI). JSON back:
        ``{"ok": true, "state": ...}`` or ``{"ok": false, "error": ...}``."""
        obs = self.server_obs
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        n = int(self.headers.get("Content-Length") or 0)
        if n > 4096:
            return self._send(413, b"body too large\n", "text/plain")
        if n:
            self.rfile.read(n)                  # nothing is read from a body
        who = obs.identity(self._token(query))
        if who is None:
            return self._send(401, b"a token is needed\n", "text/plain",
                              {"WWW-Authenticate": 'Bearer realm="harmony"'})
        if url.path != "/api/control":
            return self._send(404, b"not found\n", "text/plain")
        if self.headers.get(CONTROL_HEADER) != "1":
            return self._json(403, {"ok": False, "error": f"the {CONTROL_HEADER} header is "
                                                          f"needed (the dashboard sends it)"})
        action = (query.get("action") or [""])[0]
        job = (query.get("job") or [""])[0]
        if action not in CONTROLS or not job or len(job) > 128:
            return self._json(400, {"ok": False, "error": "action must be cancel, pause or "
                                                          "resume, with a job"})
        if obs.control is None:
            return self._json(503, {"ok": False, "error": "this master takes no controls here"})
        try:
            reply = obs.control(action, {"job": job}, *who)
        except (TimeoutError, ValueError) as exc:
            return self._json(503, {"ok": False, "error": str(exc)})
        if reply.type == "error":
            code = 403 if reply["code"] in ("forbidden", "not_owner") else 409
            return self._json(code, {"ok": False, "error": reply["message"],
                                     "code": reply["code"]})
        log.info("dashboard: %s %s by %s %r", action, job, who[0] or "a peer", who[1])
        return self._json(200, {"ok": True, **(reply.get("info") or {})})

    def _json(self, code: int, obj: dict) -> None:
        self._send(code, json.dumps(obj).encode(), "application/json")

    def _file(self, name: str, extra: dict) -> None:
        p = (STATIC / name).resolve()
        if STATIC not in p.parents or not p.is_file():
            return self._send(404, b"not found\n", "text/plain")
        self._send(200, p.read_bytes(), _TYPES.get(p.suffix, "application/octet-stream"),
                   extra)


def _offsets(text: str) -> dict[str, tuple[str | None, int]] | None:
    """The page's ``offsets`` (machine -> [log name or null, byte offset]),
    checked; None if malformed."""
    if len(text) > 16384:
        return None
    try:
        raw = json.loads(text)
    except ValueError:
        return None
    if not isinstance(raw, dict) or len(raw) > 256:
        return None
    out: dict[str, tuple[str | None, int]] = {}
    for machine, v in raw.items():
        if not names.NAME_RE.fullmatch(machine) or not isinstance(v, list) or len(v) != 2:
            return None
        logname, offset = v
        if not (logname is None or (isinstance(logname, str)
                                    and names.NAME_RE.fullmatch(logname))):
            return None
        if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset < 2**53:
            return None
        out[machine] = (logname, offset)
    return out


# -- the master's messages about observability (answered without its core) ---------
MESSAGES = frozenset({"dashboard_info", "log_sources"})


def answer(master, msg, role: str, name: str) -> bytes:
    """The reply to a ``MESSAGES`` message from an authenticated ``role``/
    ``name`` (both "" without keys): the dashboard's URL and this key's token,
    or which machines' data services hold a job's logs. Client and reader
    keys only. Reads ``master.keys``, ``master.obs``, ``master.jobs`` and
    ``master.workers``."""
    from harmony.comm import messages as M
    if getattr(master, "keys", None) is not None and role not in ("client", "reader"):
        log.warning("%s refused from %s %r", msg.type, role or "an unknown key", name)
        return M.error("forbidden", f"{msg.type!r} is not allowed for this key")
    if msg.type == "dashboard_info":
        obs = getattr(master, "obs", None)
        return M.encode("dashboard", **(obs.info(role, name) if obs is not None else {}))
    if msg.type == "log_sources":
        job = master.jobs.get(msg["job"])
        if job is None:
            return M.error("unknown_job", f"no job {msg['job']!r}")
        return M.encode("log_places", job=job.id, machines=[
            [w.name, w.data_endpoint] for w in sorted(master.workers.values(),
                                                      key=lambda w: w.name)
            if w.alive and w.data_endpoint])
    return M.error("unexpected", f"not an observability message: {msg.type!r}")


def _log_keys(directory: str):
    """(the reader key ``LOG_READER`` of the key set in ``directory``, "") if
    this master holds its secret, else (None, why not)."""
    from harmony.comm import security
    try:
        return security.Keys.load(directory, "reader", LOG_READER), ""
    except (OSError, security.SecurityError) as exc:
        log.warning("the dashboard's job pages will not show logs: %s", exc)
        return None, (f"this master holds no reader key {LOG_READER!r} to read logs with "
                      f"(see its log); 'harmony logs JOB --follow' reads them")


def start(master, host: str | None, port: int | None) -> ObsServer | None:
    """The master's hook: its dashboard on ``host:port`` (None: no dashboard),
    started; None if the port cannot be bound (logged: the master runs on)."""
    if port is None or port < 0:
        return None
    try:
        obs = ObsServer(host or "127.0.0.1", port, getattr(master, "keys", None),
                        getattr(master, "state_dir", None))
        obs.control = getattr(master, "dashboard_request", None)
        keys = getattr(master, "keys", None)
        if keys is not None:
            obs.log_keys, obs.log_why = _log_keys(keys.directory)
        return obs.start()
    except OSError as exc:
        log.error("no dashboard: cannot bind %s:%s: %s", host, port, exc)
        return None
