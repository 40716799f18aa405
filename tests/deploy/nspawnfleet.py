"""T2 of the deploy tests: a fleet of real systemd hosts on this machine.

A minimal Debian bookworm root file system is made once with debootstrap
(from Debian's package mirror) and cached under $HARMONY_T2_CACHE (default
/var/cache/harmony-t2, never in the repository). Each host is that rootfs
under an overlay of its own, booted with `systemd-nspawn -b` (systemd is
PID 1), its own network namespace on a veth pair into a bridge this module
makes (10.213.0.0/24 by default; the machine itself is .1), with sshd, a
per-host host key (written to the known_hosts file the playbooks check), and
a `debian` user with passwordless sudo that logs in with a key made per run.
The hosts reach the package registries through NAT (an nftables table of
this module's own), so the playbooks install from the same places the
project's own install does: Debian's mirror for apt, and pip's configuration
of this machine (its settings written to the hosts' /etc/pip.conf, the local
wheel directories and indexes it names bound read-only into the hosts, the
CA bundle it trusts copied in) for torch and the Python packages.

Needs root, systemd-nspawn (systemd-container), debootstrap, overlayfs,
nft, ip and rsync; `unavailable()` says what is missing.
"""
from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

CACHE = Path(os.environ.get("HARMONY_T2_CACHE", "/var/cache/harmony-t2"))
SUITE = "bookworm"
MIRROR = os.environ.get("HARMONY_T2_MIRROR", "http://deb.debian.org/debian")
# Bump when the rootfs recipe below changes: a new cache directory is made.
ROOTFS_VERSION = "v1"
PACKAGES = ["systemd", "systemd-sysv", "dbus", "openssh-server", "sudo", "python3",
            "python3-apt", "iproute2", "ca-certificates"]
SUBNET = ipaddress.ip_network(os.environ.get("HARMONY_T2_SUBNET", "10.213.0.0/24"))
BRIDGE = os.environ.get("HARMONY_T2_BRIDGE", "ht2br0")
NAT_TABLE = "harmony_t2_nat"
USER = "debian"
# Read-only binds from this machine (when they exist): the local wheel
# directories and indexes of this project's machines, and whatever else
# pip's configuration names on this machine's disk (pip_paths).
PIP_BINDS = ["/opt/wheels", "/opt/pypi", "/opt/pypi-more"]
CA_IN_HOST = "/etc/ssl/harmony-t2-ca.pem"
TOOLS = ["systemd-nspawn", "debootstrap", "nft", "ip", "rsync", "ssh", "ssh-keygen", "mount"]


def unavailable() -> str:
    """Why a fleet cannot be made here ('' when it can)."""
    if os.geteuid() != 0:
        return "needs root (debootstrap, systemd-nspawn, overlay mounts, a bridge and NAT)"
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return (f"missing tools: {', '.join(missing)} "
                "(apt-get install systemd-container debootstrap nftables iproute2 rsync openssh-client)")
    if "overlay" not in Path("/proc/filesystems").read_text():
        return "the kernel has no overlayfs"
    return ""


def sh(*cmd: str, check: bool = True, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    cp = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, **kw)
    if check and cp.returncode != 0:
        raise RuntimeError(f"$ {' '.join(cmd)}\nrc={cp.returncode}\n{cp.stdout}\n{cp.stderr}")
    return cp


def rootfs() -> Path:
    """The cached rootfs, made when missing (debootstrap: a few minutes)."""
    done = CACHE / f"{SUITE}-{ROOTFS_VERSION}"
    if (done / ".harmony-t2-ready").exists():
        return done
    tmp = CACHE / f"{SUITE}-{ROOTFS_VERSION}.tmp"
    CACHE.mkdir(parents=True, exist_ok=True)
    if not (tmp / ".debootstrap-done").exists():
        shutil.rmtree(tmp, ignore_errors=True)
        sh("debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}",
           SUITE, str(tmp), MIRROR, timeout=1800)
        (tmp / ".debootstrap-done").touch()

    def chroot(script: str) -> None:
        sh("chroot", str(tmp), "/bin/sh", "-ec", script, timeout=300)

    chroot(f"id -u {USER} >/dev/null 2>&1 || useradd -m -s /bin/bash {USER}\n"
           f"echo '{USER} ALL=(ALL) NOPASSWD:ALL' > /etc/sudoers.d/{USER}\n"
           f"chmod 0440 /etc/sudoers.d/{USER}\n"
           # host keys are made per host by the fleet (the rootfs is shared)
           "rm -f /etc/ssh/ssh_host_*\n"
           "printf 'PasswordAuthentication no\\nHostKey /etc/ssh/ssh_host_ed25519_key\\n' "
           "> /etc/ssh/sshd_config.d/harmony-t2.conf\n"
           "systemctl enable systemd-networkd ssh\n"
           # no apt run of its own racing the playbooks' apt tasks; no getty
           "systemctl mask apt-daily.timer apt-daily-upgrade.timer console-getty.service\n"
           "rm -f /etc/hostname /etc/machine-id /var/lib/dbus/machine-id\n"
           "apt-get clean\n")
    (tmp / ".harmony-t2-ready").touch()
    tmp.rename(done)
    return done


def pip_options() -> dict[str, str]:
    """This machine's pip settings (its config files and PIP_* variables, as
    `pip config list` shows them)."""
    cp = sh(sys.executable, "-m", "pip", "config", "list", check=False)
    opts: dict[str, str] = {}
    for line in cp.stdout.splitlines():
        key, _, val = line.partition("=")
        section, _, name = key.rpartition(".")
        if section in ("global", ":env:", "install") and val:
            opts[name] = val.strip().strip("'\"")
    return opts


def pip_paths(opts: dict[str, str]) -> list[str]:
    """The files and directories of this machine that pip's settings name
    (a constraint or requirement file, find-links, file:// indexes): the
    hosts see them at the same paths, read-only. A host whose pip.conf
    names a file it cannot read fails every pip install (#37 item 8)."""
    out: list[str] = []
    for name, val in opts.items():
        if name == "cert":             # the hosts get the CA bundle copied instead
            continue
        for word in val.split():
            path = word.removeprefix("file://")
            if path.startswith("/") and os.path.exists(path):
                # a file's directory: pip may read files beside it (-c, -r)
                out.append(path if os.path.isdir(path) else os.path.dirname(path))
    return sorted(set(out))


def pip_conf() -> str:
    """/etc/pip.conf for the hosts: this machine's pip settings, with the CA
    bundle it trusts (a TLS-intercepting proxy's CA, if any) copied in."""
    opts = pip_options()
    opts["cert"] = CA_IN_HOST
    return "[global]\n" + "".join(f"{k} = {v}\n" for k, v in sorted(opts.items()))


def host_ca() -> Path:
    return Path(os.environ.get("PIP_CERT") or os.environ.get("SSL_CERT_FILE")
                or "/etc/ssl/certs/ca-certificates.crt")


def _resolver() -> str:
    for line in Path("/etc/resolv.conf").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "nameserver" and not parts[1].startswith("127."):
            return parts[1]
    return "1.1.1.1"


@dataclass
class Host:
    name: str
    address: str
    dir: Path
    proc: subprocess.Popen | None = None
    host_key: str = ""

    @property
    def merged(self) -> Path:
        return self.dir / "merged"


@dataclass
class Fleet:
    """Boot `names` as systemd-nspawn hosts; `.stop()` powers them off."""
    workdir: Path
    names: list[str]
    hosts: dict[str, Host] = field(default_factory=dict)
    gateway: str = str(SUBNET.network_address + 1)
    # An address of this machine on the bridge that is neither the operator
    # nor a fleet host: the firewall must drop it.
    outsider: str = str(SUBNET.network_address + 99)
    _forward_before: str = "0"

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.key = self.workdir / "id_ed25519"
        self.known_hosts = self.workdir / "known_hosts"
        self.log_dir = self.workdir / "boot-logs"

    # -- network ------------------------------------------------------------
    def _network_up(self) -> None:
        self._network_down()
        sh("ip", "link", "add", BRIDGE, "type", "bridge")
        sh("ip", "addr", "add", f"{self.gateway}/{SUBNET.prefixlen}", "dev", BRIDGE)
        sh("ip", "addr", "add", f"{self.outsider}/32", "dev", BRIDGE)
        sh("ip", "link", "set", BRIDGE, "up")
        fwd = Path("/proc/sys/net/ipv4/ip_forward")
        self._forward_before = fwd.read_text().strip()
        fwd.write_text("1\n")
        sh("nft", "-f", "-", input=(
            f"table ip {NAT_TABLE} {{\n"
            f"  chain postrouting {{ type nat hook postrouting priority srcnat; policy accept;\n"
            f"    ip saddr {SUBNET} oifname != \"{BRIDGE}\" masquerade\n  }}\n}}\n"))

    def _network_down(self) -> None:
        sh("nft", "delete", "table", "ip", NAT_TABLE, check=False)
        sh("ip", "link", "del", BRIDGE, check=False)
        if self._forward_before != "1":
            Path("/proc/sys/net/ipv4/ip_forward").write_text(self._forward_before + "\n")

    # -- hosts --------------------------------------------------------------
    def _prepare(self, h: Host, base: Path) -> None:
        upper = h.dir / "upper"
        for d in ("upper", "work", "merged"):
            (h.dir / d).mkdir(parents=True, exist_ok=True)
        etc = upper / "etc"
        (etc / "systemd" / "network").mkdir(parents=True, exist_ok=True)
        (etc / "hostname").write_text(h.name + "\n")
        (etc / "systemd" / "network" / "10-host0.network").write_text(
            f"[Match]\nName=host0\n\n[Network]\nAddress={h.address}/{SUBNET.prefixlen}\n"
            f"Gateway={self.gateway}\nDNS={_resolver()}\nLinkLocalAddressing=no\n")
        (etc / "resolv.conf").write_text(f"nameserver {_resolver()}\n")
        (etc / "pip.conf").write_text(pip_conf())
        (etc / "ssl").mkdir(exist_ok=True)
        shutil.copyfile(host_ca(), upper / CA_IN_HOST.lstrip("/"))
        (etc / "ssh").mkdir(exist_ok=True)
        hk = etc / "ssh" / "ssh_host_ed25519_key"
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", h.name, "-f", str(hk))
        h.host_key = " ".join(Path(f"{hk}.pub").read_text().split()[:2])
        uid = gid = None
        for line in (base / "etc" / "passwd").read_text().splitlines():
            f = line.split(":")
            if f[0] == USER:
                uid, gid = int(f[2]), int(f[3])
        ssh_dir = upper / "home" / USER / ".ssh"
        ssh_dir.mkdir(parents=True, exist_ok=True)
        (ssh_dir / "authorized_keys").write_text(Path(f"{self.key}.pub").read_text())
        for p, mode in ((ssh_dir.parent, 0o755), (ssh_dir, 0o700), (ssh_dir / "authorized_keys", 0o600)):
            os.chown(p, uid, gid)
            p.chmod(mode)
        sh("mount", "-t", "overlay", "overlay", "-o",
           f"lowerdir={base},upperdir={upper},workdir={h.dir / 'work'}", str(h.merged))

    def _boot(self, h: Host) -> None:
        binds = [f"--bind-ro={p}" for p in
                 sorted({*(p for p in PIP_BINDS if os.path.exists(p)),
                         *pip_paths(pip_options())})]
        self.log_dir.mkdir(exist_ok=True)
        log = open(self.log_dir / f"{h.name}.log", "wb")
        h.proc = subprocess.Popen(
            ["systemd-nspawn", "--quiet", "--register=no", "--keep-unit", "-D", str(h.merged),
             f"--machine=ht2-{h.name}"[:64], f"--hostname={h.name}", "--boot",
             f"--network-bridge={BRIDGE}", "--resolv-conf=off", "--console=passive",
             "--link-journal=no", *binds],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

    def _wait_ssh(self, h: Host, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if h.proc.poll() is not None:
                raise RuntimeError(f"{h.name}: systemd-nspawn exited rc={h.proc.returncode}:\n"
                                   + (self.log_dir / f"{h.name}.log").read_text(errors="replace")[-3000:])
            try:
                with socket.create_connection((h.address, 22), timeout=2) as s:
                    s.settimeout(5)
                    if s.recv(4).startswith(b"SSH-"):
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{h.name}: no sshd on {h.address}:22 after {timeout}s")
            time.sleep(1)

    def start(self) -> "Fleet":
        base = rootfs()
        if not self.key.exists():
            sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "harmony-t2-operator",
               "-f", str(self.key))
        self._network_up()
        for i, name in enumerate(self.names):
            h = Host(name, str(SUBNET.network_address + 11 + i), self.workdir / "hosts" / name)
            self.hosts[name] = h
            self._prepare(h, base)
            self._boot(h)
        for h in self.hosts.values():
            self._wait_ssh(h)
        self.known_hosts.write_text("".join(f"{h.address} {h.host_key}\n" for h in self.hosts.values()))
        for h in self.hosts.values():
            self._wait_booted(h)
        return self

    def _wait_booted(self, h: Host, timeout: float = 120) -> None:
        # pam_nologin refuses logins until the boot is over
        deadline = time.monotonic() + timeout
        while True:
            cp = self.ssh(h.name, "systemctl is-system-running --wait", check=False, timeout=60)
            if cp.stdout.strip() in ("running", "degraded"):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{h.name}: not booted after {timeout}s: {cp.stdout} {cp.stderr}")
            time.sleep(1)

    def stop(self, timeout: float = 60) -> None:
        for h in self.hosts.values():
            if h.proc is not None and h.proc.poll() is None:
                h.proc.send_signal(signal.SIGTERM)  # nspawn -b: an orderly poweroff of the host
        for h in self.hosts.values():
            if h.proc is None:
                continue
            try:
                h.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                h.proc.kill()
                h.proc.wait(10)
        for h in self.hosts.values():
            sh("umount", str(h.merged), check=False)
        self._network_down()

    # -- access -------------------------------------------------------------
    def ssh_args(self) -> list[str]:
        return ["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
                "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "ConnectTimeout=10",
                "-i", str(self.key)]

    def ssh(self, name: str, command: str, timeout: float = 120, check: bool = True
            ) -> subprocess.CompletedProcess:
        h = self.hosts[name]
        return sh("ssh", *self.ssh_args(), f"{USER}@{h.address}", command,
                  timeout=timeout, check=check)
