"""Pytest plugin: the Cloud Functions source archive as Google's Python buildpack runs it.

``functions/build.sh`` builds the archive once a session; it is unpacked in a temporary
directory, and its ``requirements.txt`` alone is installed into a venv (no looprelay, no
project venv on the path). The venv is kept between sessions under
``~/.cache/looprelay/functions-venv-<hash>``, named by the requirements, the Python version
and the platform, so a run installs nothing until one of them changes (``LOOPRELAY_CACHE``
moves the cache). Each function is then served by the bare ``functions-framework`` command
from the unpacked archive, as the buildpack starts it: gunicorn's arbiter imports ``main``
and forks one uvicorn worker that serves.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "functions" / "build.sh"
START_SECONDS = 60.0
INSTALL_SECONDS = 600
CACHE_ENV = "LOOPRELAY_CACHE"
_DONE = "looprelay-installed.json"
# What the surrounding test run sets that a deployed function would not have.
_FOREIGN_ENV = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "FUNCTION_TARGET", "LOOPRELAY_CONFIG")


def build_archive(out: Path, **env: str) -> Path:
    """Build the archive at ``out`` with ``functions/build.sh`` (``env`` added to ours)."""
    subprocess.run(
        ["bash", str(BUILD), str(out)],
        check=True,
        capture_output=True,
        env=os.environ | {"PYTHON": sys.executable} | env,
        timeout=60,
    )
    return out


@dataclass(frozen=True)
class Deployed:
    """The unpacked archive and a venv holding only its requirements."""

    source: Path
    bin: Path
    install_seconds: float
    """How long installing the requirements took when the venv was made (maybe in an
    earlier session: it is cached)."""

    def env(self, **extra: str) -> dict[str, str]:
        """The environment a deployed function gets: ours minus the test run's Python setup
        and looprelay settings, plus ``extra``."""
        env = {k: v for k, v in os.environ.items() if k not in _FOREIGN_ENV}
        env = {k: v for k, v in env.items() if not k.startswith("LOOPRELAY__")}
        return env | {"PATH": f"{self.bin}{os.pathsep}{env.get('PATH', '')}"} | extra


def _cache_dir() -> Path:
    configured = os.environ.get(CACHE_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "looprelay"


def _venv_key(requirements: bytes) -> str:
    digest = hashlib.sha256(requirements)
    digest.update(f"{sys.version_info[:3]} {platform.machine()} {sys.platform}".encode())
    return digest.hexdigest()[:16]


def _installed_venv(requirements: Path) -> tuple[Path, float]:
    """The venv holding ``requirements``, made unless the cache has it; and how long its
    install took. Sessions running at once wait for each other on a lock file."""
    cache = _cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    venv = cache / f"functions-venv-{_venv_key(requirements.read_bytes())}"
    with (cache / f"{venv.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = venv / _DONE
        if done.is_file():
            return venv, float(json.loads(done.read_text())["install_seconds"])
        shutil.rmtree(venv, ignore_errors=True)  # a half-made one, from an interrupted run
        started = time.monotonic()
        # No pip of its own: the test run's pip installs into it with --python, which saves
        # ensurepip's seconds. Made in place: a venv's scripts name its path.
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install"]
        quiet = ["--quiet", "--no-compile", "--disable-pip-version-check"]
        result = subprocess.run(
            [*pip, *quiet, "-r", str(requirements)],
            capture_output=True,
            text=True,
            timeout=INSTALL_SECONDS,
            check=False,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        seconds = time.monotonic() - started
        done.write_text(json.dumps({"install_seconds": seconds}))
        return venv, seconds


@pytest.fixture(scope="session")
def functions_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The archive, built once a session."""
    return build_archive(tmp_path_factory.mktemp("archive") / "functions-source.zip")


@pytest.fixture(scope="session")
def deployed(functions_archive: Path, tmp_path_factory: pytest.TempPathFactory) -> Deployed:
    """The archive unpacked, and the (cached) venv of its requirements.txt."""
    source = tmp_path_factory.mktemp("deployed") / "source"
    with zipfile.ZipFile(functions_archive) as opened:
        opened.extractall(source)
    venv, seconds = _installed_venv(source / "requirements.txt")
    return Deployed(source, venv / "bin", install_seconds=seconds)


def free_port() -> int:
    """A loopback port the OS has just handed out."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class Served:
    """One ``functions-framework`` process serving one target: gunicorn's arbiter."""

    process: subprocess.Popen[bytes]
    url: str
    log: Path

    def output(self) -> str:
        """What it wrote to stdout and stderr so far."""
        return self.log.read_text(errors="replace")

    def wait_until_listening(self) -> None:
        """Return once it accepts connections; fail the test if it exits or is not within
        ``START_SECONDS``."""
        port = int(self.url.rsplit(":", 1)[1])
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"functions-framework exited early:\n{self.output()[-3000:]}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.1)
        pytest.fail(f"functions-framework did not listen in {START_SECONDS} s:\n{self.output()}")

    def workers(self) -> list[int]:
        """The pids of the arbiter's children: gunicorn's workers (one, unless it is
        replacing one that died)."""
        children = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # gone meanwhile
            if int(fields[1]) == self.process.pid:  # the field after the state is the ppid
                children.append(int(stat.parent.name))
        return sorted(children)


@pytest.fixture
def serve(deployed: Deployed, tmp_path: Path) -> Iterator[Callable[..., Served]]:
    """Start ``functions-framework --target T --signature-type http`` in the unpacked
    archive, as the buildpack does (``FUNCTION_TARGET`` and ``K_SERVICE`` set, as the platform
    sets them); every process started is stopped after the test."""
    started: list[subprocess.Popen[bytes]] = []

    def start(target: str, **env: str) -> Served:
        port = free_port()
        log = tmp_path / f"{target}-{len(started)}.log"
        command = ["functions-framework", "--target", target, "--signature-type", "http"]
        platform_env = {"FUNCTION_TARGET": target, "K_SERVICE": target, "PORT": str(port)}
        with log.open("wb") as sink:
            process = subprocess.Popen(
                [*command, "--host", "127.0.0.1", "--port", str(port)],
                cwd=deployed.source,
                env=deployed.env(**platform_env, **env),
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        started.append(process)
        return Served(process, f"http://127.0.0.1:{port}", log)

    yield start
    for process in started:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)
