"""harness_npm.py — the official npm clients the tests drive (SDKs, the
OpenTelemetry JS SDK), installed once per artifacts directory and run with
node. Part of harness.py."""

import json
import os
import shutil
import subprocess

__all__ = ["npm_install", "run_node", "NodeScript"]


def _installed(prefix, specs):
    for spec in specs:
        name, at, version = spec.rpartition("@")
        if not name:  # a bare name ("@scope/pkg" has its "@" at 0): any version
            name, version = spec, None
        mark = os.path.join(prefix, "node_modules", name, "package.json")
        if not os.path.exists(mark):
            return False
        if version is not None:
            with open(mark) as f:
                if json.load(f)["version"] != version:
                    return False
    return True


def npm_install(prefix, specs, timeout=180):
    """Installs the npm packages `specs` ("name@version"; a bare name takes
    the version npm resolves) under `prefix`, unless they are there at those
    versions already. Fails the test with what went wrong when node or npm
    is missing, the registry does not answer within `timeout` seconds, or
    the install fails. Returns prefix."""
    specs = list(specs)
    if _installed(prefix, specs):
        return prefix
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            raise AssertionError("%s is not installed: run contrib/setup.sh (it installs Debian's nodejs and npm)"
                                 % tool)
    os.makedirs(prefix, exist_ok=True)
    try:
        p = subprocess.run(["npm", "install", "--prefix", prefix, "--no-audit", "--no-fund", "--no-save"] + specs,
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError("npm install %s did not finish within %d s (no registry access?)"
                             % (" ".join(specs), timeout))
    if p.returncode != 0 or not _installed(prefix, specs):
        raise AssertionError("npm install %s into %s failed (exit %d):\n%s" % (
            " ".join(specs), prefix, p.returncode, (p.stdout + p.stderr)[-3000:]))
    return prefix


def run_node(script, *args, timeout=60, env=None):
    """node SCRIPT ARGS...: its stdout parsed as JSON; a non-zero exit fails
    the test with its stderr. `env` adds variables for that child alone:
    the test process's own environment (NODE_EXTRA_CA_CERTS, which npm may
    need to reach its registry) is never changed."""
    p = subprocess.run(["node", script] + [str(a) for a in args], capture_output=True, text=True, timeout=timeout,
                       env=None if env is None else dict(os.environ, **env))
    if p.returncode != 0:
        raise AssertionError("node %s exited %d:\n%s" % (script, p.returncode, p.stderr[-3000:]))
    return json.loads(p.stdout)


class NodeScript:
    """A node script of tests/integration/ and the npm packages it needs,
    installed under tests/artifacts/DIRNAME: install() once (npm_install),
    then each call runs `node SCRIPT PREFIX ARGS...` (run_node)."""

    def __init__(self, dirname, specs, script, install_timeout=180, run_timeout=60):
        here = os.path.dirname(os.path.abspath(__file__))
        self.prefix = os.path.join(os.path.dirname(here), "artifacts", dirname)
        self.specs = list(specs)
        self.script = os.path.join(here, script)
        self.install_timeout, self.run_timeout = install_timeout, run_timeout

    def install(self):
        return npm_install(self.prefix, self.specs, self.install_timeout)

    def __call__(self, *args, env=None):
        return run_node(self.script, self.prefix, *args, timeout=self.run_timeout, env=env)
