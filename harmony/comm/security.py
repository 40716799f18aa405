"""CurveZMQ on every socket (Ironhouse): both ends authenticated, traffic
encrypted, unknown keys refused by a ZAP handler before any message is read.

A cluster's key set lives in one directory (``harmony keys init``):

    KEYS/cluster.key[_secret]        the cluster's server key pair: every
                                     ROUTER socket (master, daemons' data
                                     services and executor sockets, PS shards)
                                     presents it; master and workers hold it
    KEYS/workers/NAME.key[_secret]   one pair per worker: a daemon and its
                                     executors connect with it, and the master
                                     binds the worker's name to it
    KEYS/clients/NAME.key[_secret]   users: job control (submit, cancel, ...)
    KEYS/readers/NAME.key[_secret]   read-only users (jobs, status)

A process ``use()``s the keys of its role once; from then on
:func:`harmony.comm.zmqutil.make_socket` makes every ROUTER a CURVE server
(behind this process's ZAP handler, which accepts the public keys of the
key set) and every DEALER a CURVE client with its own key pair. The peer of
a message is known from its ZeroMQ ``User-Id`` (the z85 public key), which
:meth:`Keys.peer` maps to ``(role, name)``. Secret files must be readable by
their owner only; a key set with looser modes is refused.
"""
from __future__ import annotations

import os
import stat
import threading
from dataclasses import dataclass, field

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

ROLES = ("workers", "clients", "readers")


class SecurityError(RuntimeError):
    pass


def _pair(directory: str, name: str) -> tuple[bytes, bytes]:
    os.makedirs(directory, mode=0o700, exist_ok=True)
    pub, sec = zmq.auth.create_certificates(directory, name)
    os.chmod(sec, 0o600)
    os.chmod(pub, 0o644)
    return zmq.auth.load_certificate(sec)


def init_keys(directory: str, workers: list[str] = (), clients: list[str] = ("admin",),
              readers: list[str] = ("reader",)) -> str:
    """Make a key set (a missing cluster pair, and missing worker, client
    and reader pairs); existing keys are kept. Returns the directory."""
    directory = os.path.abspath(directory)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    os.chmod(directory, 0o700)
    if not os.path.exists(os.path.join(directory, "cluster.key_secret")):
        _pair(directory, "cluster")
    for role, names in (("workers", workers), ("clients", clients), ("readers", readers)):
        for n in names:
            if not os.path.exists(os.path.join(directory, role, f"{n}.key_secret")):
                _pair(os.path.join(directory, role), n)
    return directory


def check_modes(directory: str) -> None:
    """Refuse secret keys readable by anyone but their owner."""
    for root, _dirs, files in os.walk(directory):
        for f in files:
            if f.endswith(".key_secret"):
                path = os.path.join(root, f)
                mode = os.stat(path).st_mode
                if mode & (stat.S_IRWXG | stat.S_IRWXO):
                    raise SecurityError(f"secret key {path} is readable by others (mode "
                                        f"{oct(mode & 0o777)}): chmod 600 it")


@dataclass
class Keys:
    """One process's view of a key set."""
    directory: str
    server_public: bytes
    server_secret: bytes | None        # None for users (they run no server socket)
    public: bytes
    secret: bytes
    role: str                          # "master", "worker", "client", "reader"
    name: str
    known: dict[bytes, tuple[str, str]] = field(default_factory=dict)  # z85 -> (role, name)

    @classmethod
    def load(cls, directory: str, role: str, name: str = "") -> "Keys":
        directory = os.path.abspath(directory)
        if not os.path.isfile(os.path.join(directory, "cluster.key")):
            raise SecurityError(f"no cluster key set in {directory} ('harmony keys init "
                                f"--dir {directory}' makes one)")
        check_modes(directory)
        server_public, _ = zmq.auth.load_certificate(os.path.join(directory, "cluster.key"))
        server_secret = None
        if role in ("master", "worker"):
            path = os.path.join(directory, "cluster.key_secret")
            if not os.path.isfile(path):
                raise SecurityError(f"{role} needs the cluster's secret key {path}")
            _, server_secret = zmq.auth.load_certificate(path)
        if role == "master":
            public, secret = server_public, server_secret
        else:
            sub = {"worker": "workers", "client": "clients", "reader": "readers"}[role]
            path = os.path.join(directory, sub, f"{name}.key_secret")
            if not os.path.isfile(path):
                raise SecurityError(f"no {role} key {name!r} in {directory} ({path}); "
                                    f"'harmony keys init --dir {directory} --{role}s {name}'")
            public, secret = zmq.auth.load_certificate(path)
        keys = cls(directory, server_public, server_secret, public, secret, role, name)
        keys.reload()
        return keys

    def reload(self) -> None:
        """(Re)read the public keys of the set (e.g. a worker added)."""
        known = {self.server_public: ("cluster", "")}
        for role in ROLES:
            d = os.path.join(self.directory, role)
            if not os.path.isdir(d):
                continue
            for f in sorted(os.listdir(d)):
                if f.endswith(".key"):
                    pub, _ = zmq.auth.load_certificate(os.path.join(d, f))
                    known[pub] = (role[:-1], f[:-4])
        self.known = known

    def peer(self, user_id: str | bytes | None) -> tuple[str, str]:
        """``(role, name)`` of an authenticated peer from its User-Id."""
        if not user_id:
            return ("", "")
        z = user_id.encode() if isinstance(user_id, str) else user_id
        return self.known.get(z, ("", ""))

    def worker_name(self, user_id) -> str | None:
        role, name = self.peer(user_id)
        return name if role == "worker" else None


class _Provider:
    def __init__(self, keys: Keys) -> None:
        self.keys = keys

    def callback(self, domain: str, key: bytes) -> bool:
        return key in self.keys.known


_lock = threading.Lock()
_current: Keys | None = None
_insecure = False
_auths: dict[int, ThreadAuthenticator] = {}


def use(keys: Keys | None, insecure: bool = False) -> None:
    """This process's keys (or, only with ``insecure``, none at all)."""
    global _current, _insecure
    with _lock:
        _current, _insecure = keys, insecure


def current() -> Keys | None:
    return _current


def secure_socket(ctx: zmq.Context, sock: zmq.Socket, kind: int,
                  keys: Keys | None = None) -> None:
    """Make ``sock`` a CURVE server (ROUTER) or client (other kinds)."""
    keys = keys or _current
    if keys is None:
        return
    if kind == zmq.ROUTER:
        if keys.server_secret is None:
            raise SecurityError(f"a {keys.role} key cannot serve a socket")
        _authenticator(ctx, keys)
        sock.curve_server = True
        sock.curve_publickey = keys.server_public
        sock.curve_secretkey = keys.server_secret
    else:
        sock.curve_serverkey = keys.server_public
        sock.curve_publickey = keys.public
        sock.curve_secretkey = keys.secret


def _authenticator(ctx: zmq.Context, keys: Keys) -> None:
    """One ZAP handler per context: it admits the key set's public keys."""
    with _lock:
        if id(ctx) in _auths:
            return
        auth = ThreadAuthenticator(ctx, log=None)
        auth.start()
        auth.configure_curve_callback("*", _Provider(keys))
        _auths[id(ctx)] = auth


def stop_authenticator(ctx: zmq.Context) -> None:
    """Before ``ctx.term()``: stop its ZAP handler."""
    with _lock:
        auth = _auths.pop(id(ctx), None)
    if auth is not None:
        auth.stop()


def resolve_dir(explicit: str | None, default: str | None = None) -> str | None:
    """The key dir: a flag, else ``$HARMONY_KEYS``, else ``default`` if it
    holds a key set."""
    for d in (explicit, os.environ.get("HARMONY_KEYS"), default):
        if d and os.path.isfile(os.path.join(d, "cluster.key")):
            return d
        if d and d == explicit:
            raise SecurityError(f"no key set in {d} ('harmony keys init --dir {d}')")
    return None
