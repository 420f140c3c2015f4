"""kubectl and helm through subprocess, with condition waits bounded by deadlines.

Every wait polls a condition until a deadline and, when it fails, says what it last saw."""

import json
import re
import subprocess
import tempfile
import threading
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


def split_image(image):
    """repository and tag of `repo[:tag]` (a registry port is not a tag)."""
    name, _, tag = image.rpartition(":")
    if not name or "/" in tag:
        return image, "latest"
    return name, tag


# --- objects -----------------------------------------------------------------------------------

def apply(namespace, manifest):
    """Server-side applies one object given as a dict."""
    kubectl(namespace, "apply", "--server-side", "--field-manager", "quiver-e2e", "-f", "-",
            input_text=json.dumps(manifest))


def get(namespace, kind, name):
    """The object as a dict, or None when it does not exist."""
    out = kubectl(namespace, "get", kind, name, "-o", "json", "--ignore-not-found")
    return json.loads(out) if out.strip() else None


def get_cluster(kind, name):
    """A cluster-scoped object as a dict, or None when it does not exist."""
    out = run("kubectl", "get", kind, name, "-o", "json", "--ignore-not-found")
    return json.loads(out) if out.strip() else None


def list_objects(namespace, kind, selector=None):
    """The items of `kind` in the namespace, optionally filtered by a label selector."""
    args = ["get", kind, "-o", "json"]
    if selector:
        args += ["-l", selector]
    return json.loads(kubectl(namespace, *args))["items"]


def merge_patch(namespace, kind, name, patch):
    """JSON merge patch (RFC 7386) of one object; `None` values remove fields."""
    kubectl(namespace, "patch", kind, name, "--type", "merge", "-p", json.dumps(patch))


def annotate(namespace, kind, name, key, value):
    """Sets annotation `key` to `value`, or removes it when `value` is None."""
    setting = f"{key}-" if value is None else f"{key}={value}"
    kubectl(namespace, "annotate", "--overwrite", kind, name, setting)


def delete(namespace, kind, name, wait=False, timeout_s=60):
    """Deletes one object (absent is fine); with `wait`, until it is gone or `timeout_s`."""
    kubectl(namespace, "delete", kind, name, "--ignore-not-found", f"--wait={str(wait).lower()}",
            f"--timeout={timeout_s}s", check=False, timeout=timeout_s + 30)


def drop_finalizers(namespace, kind, name):
    """Removes every finalizer of an object (absent is fine): test cleanup of last resort."""
    kubectl(namespace, "patch", kind, name, "--type", "merge",
            "-p", json.dumps({"metadata": {"finalizers": None}}), check=False)


def wait_gone(namespace, kind, name, timeout_s):
    """Waits until the object no longer exists; fails with its last metadata and status."""
    return wait_for(f"{kind}/{name} to be gone", lambda: get(namespace, kind, name) is None,
                    timeout_s, state=lambda: summary(get(namespace, kind, name)))


def summary(obj):
    """What a failure message shows of an object: finalizers, deletion, generation and status."""
    if obj is None:
        return "absent"
    metadata = obj.get("metadata") or {}
    return json.dumps({
        "generation": metadata.get("generation"),
        "deletionTimestamp": metadata.get("deletionTimestamp"),
        "finalizers": metadata.get("finalizers"),
        "annotations": metadata.get("annotations"),
        "status": obj.get("status"),
    }, indent=1, sort_keys=True)


# --- waits -------------------------------------------------------------------------------------

def wait_for(what, predicate, timeout_s, poll_s=2.0, state=None):
    """Polls `predicate` until it returns a truthy value (returned) or the deadline passes.

    An AssertionError raised by the predicate counts as "not yet" and its message is kept. On
    timeout the error names the last value or error and, when given, what `state()` returns."""
    deadline = time.monotonic() + timeout_s
    last = None
    while True:
        try:
            last = predicate()
        except AssertionError as error:
            last = error
        if last and not isinstance(last, AssertionError):
            return last
        if time.monotonic() >= deadline:
            break
        time.sleep(poll_s)
    seen = ""
    if state is not None:
        try:
            seen = f"\nstate: {state()}"
        except Exception as error:  # the state is only for the message
            seen = f"\nstate unavailable: {error!r}"
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; last: {last!r}{seen}")


def wait_for_object(namespace, kind, name, what, check, timeout_s, poll_s=2.0, context=None):
    """Polls the object until `check(obj)` is truthy and returns the object; on timeout the
    error shows the object's last status and, when given, what `context()` describes."""
    seen = {}

    def attempt():
        seen["obj"] = get(namespace, kind, name)
        return seen["obj"] is not None and check(seen["obj"]) and seen["obj"]

    def state():
        described = summary(seen.get("obj"))
        return described if context is None else f"{described}\n{context()}"

    return wait_for(f"{kind}/{name}: {what}", attempt, timeout_s, poll_s, state=state)


def holds_for(what, predicate, duration_s, poll_s=2.0, state=None):
    """Asserts `predicate` stays truthy on every poll for `duration_s` (a bounded observation,
    not a sleep: it fails as soon as the predicate turns false, with the state then)."""
    deadline = time.monotonic() + duration_s
    while True:
        value = predicate()
        if not value:
            seen = f"; state: {state()}" if state is not None else ""
            raise AssertionError(f"{what} stopped holding after "
                                 f"{duration_s - (deadline - time.monotonic()):.0f}s{seen}")
        if time.monotonic() >= deadline:
            return value
        time.sleep(poll_s)


# --- conditions and events ---------------------------------------------------------------------

def conditions(obj):
    return ((obj or {}).get("status") or {}).get("conditions") or []


def condition(obj, type_):
    """The status of condition `type_` ("True"/"False"), or None."""
    return condition_details(obj, type_).get("status")


def condition_details(obj, type_):
    """The whole condition `type_` (status, reason, message, ...), or {}."""
    for cond in conditions(obj):
        if cond.get("type") == type_:
            return cond
    return {}


def has_condition(obj, type_, status, reason=None):
    cond = condition_details(obj, type_)
    return cond.get("status") == status and (reason is None or cond.get("reason") == reason)


def events_about(namespace, obj):
    """Events (core/v1 view) whose involved object is `obj`, by uid: type, reason, message."""
    uid = obj["metadata"]["uid"]
    items = json.loads(kubectl(namespace, "get", "events", "-o", "json"))["items"]
    return [
        {"type": event.get("type"), "reason": event.get("reason"),
         "message": event.get("message") or event.get("note") or ""}
        for event in items
        if (event.get("involvedObject") or event.get("regarding") or {}).get("uid") == uid
    ]


def wait_for_event(namespace, obj, what, matches, timeout_s):
    """Waits for an event about `obj` for which `matches(event)` is true; returns it."""
    return wait_for(
        f"event about {obj['kind']}/{obj['metadata']['name']}: {what}",
        lambda: next((e for e in events_about(namespace, obj) if matches(e)), None),
        timeout_s,
        state=lambda: json.dumps(events_about(namespace, obj), indent=1),
    )


# --- pods and quantities -----------------------------------------------------------------------

def pod_is_ready(pod):
    """Ready condition True and not terminating."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def describe_pods(namespace, selector):
    """One line per pod: name, revision, Ready, and why a container waits (ImagePullBackOff...)."""
    lines = []
    for pod in list_objects(namespace, "pods", selector):
        metadata = pod["metadata"]
        waiting = [
            (c.get("state") or {}).get("waiting", {}).get("reason")
            for c in (pod.get("status") or {}).get("containerStatuses") or []
        ]
        lines.append(f"{metadata['name']} revision={metadata.get('labels', {}).get('controller-revision-hash')} "
                     f"ready={pod_is_ready(pod)} deleting={bool(metadata.get('deletionTimestamp'))} "
                     f"waiting={[w for w in waiting if w]}")
    return "\n".join(lines) or "no pods"


def pod_ordinal(pod):
    return int(pod["metadata"]["name"].rsplit("-", 1)[1])


_QUANTITY = re.compile(r"^([0-9.]+)([A-Za-z]*)$")
_UNITS = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
          "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def quantity_bytes(text):
    """Bytes of a storage quantity such as 1Gi, 512Mi or 2G."""
    found = _QUANTITY.match(str(text).strip())
    if not found or found.group(2) not in _UNITS:
        raise ValueError(f"not a storage quantity: {text!r}")
    return int(float(found.group(1)) * _UNITS[found.group(2)])


class PodWatch:
    """`kubectl get pods --watch` of one label selector in a process of its own: records every
    change, so transient states between two polls are seen too. Use as a context manager."""

    def __init__(self, namespace, selector):
        self.namespace = namespace
        self.selector = selector
        self.pods = {}
        self.history = []  # (seconds since start, {pod name: ready}) after every change
        self.changes = []  # (seconds since start, event type, pod name, revision, ready)
        self.errors = []
        self._lock = threading.Lock()
        self._started = time.monotonic()
        self._proc = None
        self._reader = None

    def __enter__(self):
        self._stderr = tempfile.TemporaryFile(mode="w+")
        self._proc = subprocess.Popen(
            ["kubectl", "--namespace", self.namespace, "get", "pods", "-l", self.selector,
             "--watch", "--output-watch-events", "-o", "json"],
            stdout=subprocess.PIPE, stderr=self._stderr, text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def __exit__(self, *exc):
        self._proc.terminate()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(timeout=10)
        self._reader.join(timeout=10)
        self._stderr.close()
        return False

    def stderr(self):
        """What kubectl said on stderr so far (for failure messages)."""
        self._stderr.seek(0)
        return self._stderr.read()[-2000:]

    def _read(self):
        decoder = json.JSONDecoder()
        buffer = ""
        for line in self._proc.stdout:
            buffer += line
            # kubectl prints indented objects: only a closing brace at column 0 can end one.
            if not line.startswith("}"):
                continue
            while True:
                stripped = buffer.lstrip()
                if not stripped:
                    buffer = ""
                    break
                try:
                    event, end = decoder.raw_decode(stripped)
                except ValueError:
                    break  # an object not complete yet
                buffer = stripped[end:]
                self._record(event)

    def _record(self, event):
        pod = event.get("object") or {}
        name = (pod.get("metadata") or {}).get("name")
        if event.get("type") == "ERROR" or not name:
            self.errors.append(event)
            return
        with self._lock:
            if event.get("type") == "DELETED":
                self.pods.pop(name, None)
            else:
                self.pods[name] = pod
            at = round(time.monotonic() - self._started, 1)
            readiness = {n: pod_is_ready(p) for n, p in self.pods.items()}
            self.history.append((at, readiness))
            revision = ((pod.get("metadata") or {}).get("labels") or {}).get("controller-revision-hash")
            self.changes.append((at, event.get("type"), name, revision, pod_is_ready(pod)))

    def snapshot(self):
        with self._lock:
            return dict(self.pods)

    def wait_all_ready(self, expected_names, timeout_s):
        """Waits until the watch itself has seen every expected pod Ready (its initial list is
        in); returns the history position to observe from."""
        def synced():
            with self._lock:
                ready = all(pod_is_ready(self.pods[n]) for n in expected_names if n in self.pods)
                return ready and all(n in self.pods for n in expected_names)
        wait_for(f"the pod watch to see {expected_names} Ready", synced, timeout_s, poll_s=0.5,
                 state=lambda: f"pods {sorted(self.snapshot())}, errors {self.errors[-3:]}, "
                               f"kubectl: {self.stderr()!r}")
        with self._lock:
            return len(self.history)

    def first_seen_on_other_revision(self, old_revision):
        """Pod names in the order they first appeared on a revision other than `old_revision`."""
        order = []
        with self._lock:
            for _, kind, name, revision, _ in self.changes:
                if kind != "DELETED" and revision and revision != old_revision and name not in order:
                    order.append(name)
        return order

    def max_not_ready(self, expected_names, since=0):
        """The most of `expected_names` not Ready (absent counts) at once over the history from
        position `since`, and the history entry where it happened."""
        worst, when = 0, None
        with self._lock:
            for entry in self.history[since:]:
                readiness = entry[1]
                not_ready = sum(1 for name in expected_names if not readiness.get(name, False))
                if not_ready > worst:
                    worst, when = not_ready, entry
        return worst, when
