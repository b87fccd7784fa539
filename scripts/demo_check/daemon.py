"""A Docker daemon of our own: Debian's dockerd on its own socket, data root,
exec root and pidfile, started and stopped by its PID.  A system daemon, if
any, is never touched; the data root persists between runs (the image cache).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from scripts.demo_check.phases import say

# A subnet pool of its own, so that the compose networks never collide with
# another daemon's (no docker0 bridge either: builds use the host's network).
ADDRESS_POOL = "base=10.213.0.0/16,size=24"
# Debian's CLI, the daemon's own version, before any other on PATH.
DOCKER = "/usr/bin/docker" if Path("/usr/bin/docker").is_file() else "docker"


class Daemon:
    def __init__(self, state: Path, run: Path) -> None:
        self.state = state
        self.run = run
        self.sock = run / "docker.sock"
        self.pidfile = run / "dockerd.pid"
        self.log = state / "dockerd.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._lock: int | None = None

    def lock(self) -> None:
        """One demo-check at a time on a machine: a second one would stop the
        first one's daemon (its pidfile) and share its state."""
        self.run.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.run / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RuntimeError(f"another demo-check holds {self.run / 'lock'}") from None
        self._lock = fd

    @property
    def host(self) -> str:
        return f"unix://{self.sock}"

    def env(self) -> dict[str, str]:
        return {**os.environ, "DOCKER_HOST": self.host}

    def docker(self, *args: str, capture: bool = False) -> subprocess.CompletedProcess[str]:
        """``docker ARGS`` against our daemon; raises on failure."""
        return subprocess.run(
            [DOCKER, *args], env=self.env(), check=True, text=True, capture_output=capture
        )

    def _left_over(self) -> int | None:
        """The PID of a daemon a killed run left behind on our pidfile."""
        try:
            pid = int(self.pidfile.read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            return None
        return pid if str(self.sock).encode() in b" ".join(cmdline) else None

    def start(self) -> None:
        dockerd = shutil.which("dockerd")
        if dockerd is None:
            raise RuntimeError("dockerd is missing (Debian's docker.io)")
        self.lock()
        old = self._left_over()
        if old is not None:
            say(f"a previous run's dockerd (pid {old}) is still up: stopping it")
            _stop_pid(old, 30)
        self.state.mkdir(parents=True, exist_ok=True)
        self.run.mkdir(parents=True, exist_ok=True)
        cmd = [
            dockerd, "--host", self.host, "--data-root", str(self.state / "data"),
            "--exec-root", str(self.run / "exec"), "--pidfile", str(self.pidfile),
            "--storage-driver", "overlay2", "--bridge", "none",
            "--default-address-pool", ADDRESS_POOL,
        ]  # fmt: skip
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
        say(f"dockerd pid {self.proc.pid} on {self.sock} (log {self.log})")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dockerd exited ({self.proc.returncode}): see {self.log}")
            ping = subprocess.run(
                [DOCKER, "version", "--format", "{{.Server.Version}}"],
                env=self.env(), capture_output=True, text=True,
            )  # fmt: skip
            if ping.returncode == 0:
                say(f"dockerd {ping.stdout.strip()} ready")
                return
            time.sleep(0.5)
        raise RuntimeError(f"dockerd did not answer within 60 s: see {self.log}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        say(f"stopping dockerd pid {self.proc.pid}")
        _stop_pid(self.proc.pid, 30)
        self.proc.wait()
        self._unmount_left()

    def _unmount_left(self) -> None:
        """What dockerd leaves mounted under its exec root when it exits (its
        default network namespace): unmounted, so that nothing of ours stays."""
        root = str(self.run) + "/"
        mounts = [ln.split()[1] for ln in Path("/proc/mounts").read_text().splitlines()]
        for point in sorted((m for m in mounts if m.startswith(root)), reverse=True):
            subprocess.run(["umount", "--lazy", point], check=False)


def _stop_pid(pid: int, grace_s: float) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        try:  # our own child: reap it
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
        except ChildProcessError:
            pass
        time.sleep(0.2)
    os.kill(pid, signal.SIGKILL)
