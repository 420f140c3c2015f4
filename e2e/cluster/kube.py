"""kubectl and helm through subprocess, with condition waits bounded by deadlines."""

import json
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run(*args, input_text=None, check=True, timeout=300):
    """Runs a command and returns its stdout; raises with stderr on failure."""
    done = subprocess.run(
        list(args), input=input_text, capture_output=True, text=True, timeout=timeout
    )
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done.stdout


def kubectl(namespace, *args, **kwargs):
    return run("kubectl", "--namespace", namespace, *args, **kwargs)


def apply(namespace, manifest):
    """Server-side applies one object given as a dict."""
    kubectl(namespace, "apply", "--server-side", "--field-manager", "quiver-e2e", "-f", "-",
            input_text=json.dumps(manifest))


def get(namespace, kind, name):
    """The object as a dict, or None when it does not exist."""
    out = kubectl(namespace, "get", kind, name, "-o", "json", "--ignore-not-found")
    return json.loads(out) if out.strip() else None


def wait_for(what, predicate, timeout_s, poll_s=2.0):
    """Polls `predicate` until it returns a truthy value (returned) or the deadline passes."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
        except AssertionError as error:
            last = error
        if last and not isinstance(last, AssertionError):
            return last
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; last: {last!r}")


def condition(obj, type_):
    """The status of condition `type_` ("True"/"False"), or None."""
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return cond.get("status")
    return None
