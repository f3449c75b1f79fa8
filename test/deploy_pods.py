#!/usr/bin/python3
"""Runs the pods of rendered Kubernetes manifests as local processes.

test/deploy_pods_test.sh renders deploy/'s overlays and calls this. For every
manifest given with --check, and the one given with --run:

  * the pods are expanded as their controllers would make them: a
    Deployment's replicas; a StatefulSet's pods NAME-K with the pod-index
    label K and the DNS name NAME-K.SERVICE; an indexed Job's pods with the
    completion-index annotation (and JOB_COMPLETION_INDEX);
  * each container's environment is built as the kubelet builds it: envFrom
    (ConfigMaps, Secrets), then env (values with $(VAR) expanded, fieldRef of
    the pod's name, labels and annotations, resourceFieldRef, ConfigMap and
    Secret keys); a reference to a missing object or key is an error, as it
    keeps the pod from starting;
  * every GRPS_* variable a container gets, and every --flag in its command,
    must name a flag of its own binary (from `BINARY --helpfull`): a daemon
    silently ignores a variable that names none, so a misspelled one in a
    manifest would otherwise go unnoticed;
  * a container that runs a Python script (the torch image's
    /usr/bin/python3, a grps.torch worker: overlays/torch) must get only the
    GRPS_* variables such a worker reads (gt.init()'s, the extension's token
    and TLS flags), none of grps-worker's own; its script must be one of the
    image's examples (/opt/grps/examples: the repository's examples/) or a
    file of a ConfigMap mounted there; and it must get torchrun's variables
    as one process alone on its pod: RANK = GRPS_RANK, WORLD_SIZE = the
    Job's completions, LOCAL_RANK = GRPS_LOCAL_RANK = 0, LOCAL_WORLD_SIZE =
    GRPS_LOCAL_SIZE = 1;
  * GRPS_SERVERS and GRPS_WORKERS must match the servers' replicas and the
    workers' completions and parallelism.

For --run, the pods then run as processes of this machine, with their
container's command, arguments and environment (a Python worker with the
build's grps package, BIN/../python, on PYTHONPATH, and the image's
examples as the repository's): each pod gets a loopback
address of its own (127.A.B.N), which stands for its IP, so that the fixed
ports of different pods do not collide; a listen address 0.0.0.0 becomes it,
and every Service and pod DNS name in a GRPS_* value or an argument becomes
the address of the pod it resolves to. Volumes are folders (one per
PersistentVolumeClaim, shared by the pods that mount it, and one per pod and
volumeClaimTemplate of a StatefulSet, as its claim "<template>-<pod>";
Secrets and ConfigMaps written out as files) and mount paths in values are rewritten to
them. The Secrets come from --secrets (deploy/make-secrets). While the job
runs, every exec probe is run (it must succeed at least once) and every pod
with prometheus.io/scrape is scraped at its annotated port and path. The
test passes when every pod exits 0 (a lookup service, `grps-server --serve`,
serves until it is stopped: once every other pod has exited it must still
run, log that it serves the job's newest checkpoint, and exit 0 on SIGTERM),
the coordinator says the job completed,
with at least --min_accuracy, and the checkpoint volume holds a complete
checkpoint (with a StatefulSet scaled, every shard's file of the count it
ends with). Every process started is ended on exit (and on this process's
death: PR_SET_PDEATHSIG).

What an operator does to a running job comes as steps, --scale and --exec,
run in the order given: the first once a checkpoint is complete, each later
one once a checkpoint newer than the one complete when the step before it
ended, all while the job trains (a step left undone when training is over
fails the test).

  * --scale NAME=N does what `kubectl scale` (a StatefulSet) or `kubectl
    patch` of completions and parallelism (an elastic indexed Job) does.
    Up: the pods of the new indexes start, each with its index, its
    environment and its volumes (a StatefulSet's pod NAME-K, which must
    serve shard K once the job takes it in; a Job's, rank K, which must
    join the running job). Down (a StatefulSet
    only): the pods of the indexes from N up are taken out of the set; one
    still running gets SIGTERM, and how it exits is not the test's concern,
    as Kubernetes deletes it. A grps server that exited 0 by itself before
    (a shard `grpsctl scale` retired) is not restarted here, though its
    StatefulSet, with restartPolicy Always, would start it again and it
    would stand by until the scale-down: its exit 0 is accepted as any
    pod's is, and it must have said it retired. A pod taken out is not
    started again.
  * --exec 'POD -- COMMAND...' runs COMMAND in POD's container as `kubectl
    exec` does, with the container's environment (the tokens of the
    Secrets, the TLS files), as its exec probes run; POD is a pod's name or
    deployment/NAME (deploy/NAME: its pod NAME-0), which must be running.
    It must exit 0; the next step waits for it. E.g. 'deploy/grps-coordinator --
    /usr/local/bin/grpsctl --coordinator=127.0.0.1:7070 scale --servers=3
    --wait': the job re-shards to the servers the StatefulSet was scaled to.

With --evict POD, that pod gets SIGTERM once a checkpoint newer than the
last step's is complete (an eviction, or the workers' Job scaled down): a
worker must say it left the job, exit 0, and the coordinator must say so
too.

With --image IMAGE (deploy/build-image), the pods run in that image instead,
with podman on the host's network: the flags are those of the image's own
binaries, each container runs as its securityContext says (user, fsGroup,
read-only root file system, capabilities dropped, no privilege escalation),
its volumes are mounted at their mount paths (owned as fsGroup makes them;
Secret files with their defaultMode), its environment is the manifest's
alone (no path rewritten), the DNS names stay names, resolved through
/etc/hosts entries to the pods' loopback addresses, and exec probes run in
the container (podman exec). Only 0.0.0.0 still becomes the pod's address,
because the pods share the host's network.
"""

import argparse
import base64
import ctypes
import os
import random
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import yaml

IMAGE_BIN = "/usr/local/bin/"
# The torch image's interpreter, and where it has the repository's examples/
# (the Dockerfile with GRPS_TORCH=ON; deploy/check_image.py checks both).
IMAGE_PYTHON = "/usr/bin/python3"
IMAGE_EXAMPLES = "/opt/grps/examples"
# What a grps.torch worker reads from the environment: gt.init()'s variables
# (python/grps/_torch.py: GRPS_COORDINATOR, GRPS_RANK, GRPS_JOB_ID,
# GRPS_REGISTER_TIMEOUT_S; gt.size(): GRPS_WORKERS; the local rank and size:
# GRPS_LOCAL_RANK, GRPS_LOCAL_SIZE; the collectives' GRPS_COLLECTIVE_TIMEOUT_S)
# and the flags the
# extension sets from GRPS_* (python/_grps.cc, Configure): daemon/security.cc's
# tokens and TLS, and daemon/metrics.cc's metrics_listen, which comes with
# every pod's common settings (config/common.env) and which a Python worker
# parses but serves nothing on. None of grps-worker's own flags.
PYTHON_WORKER_VARIABLES = {
    "GRPS_COORDINATOR", "GRPS_RANK", "GRPS_JOB_ID", "GRPS_REGISTER_TIMEOUT_S", "GRPS_WORKERS",
    "GRPS_LOCAL_RANK", "GRPS_LOCAL_SIZE", "GRPS_COLLECTIVE_TIMEOUT_S",
    "GRPS_TOKEN", "GRPS_WORKER_TOKEN", "GRPS_TLS_CERT", "GRPS_TLS_KEY", "GRPS_TLS_CA",
    "GRPS_TLS_CLIENT_AUTH", "GRPS_TLS_SERVER_NAME", "GRPS_METRICS_LISTEN"}
NAMESPACE = "default"
# The flags every absl binary has, which no manifest needs.
ABSL_FLAGS = {"flagfile", "fromenv", "tryfromenv", "undefok", "help", "helpfull",
              "helpshort", "helppackage", "version", "only_check_args", "helpon",
              "helpmatch"}


class ManifestError(Exception):
    """A manifest that Kubernetes or the daemons would not run as meant."""


def load(path):
    with open(path, encoding="utf-8") as f:
        return [o for o in yaml.safe_load_all(f) if o]


_flags_cache = {}
# podman and the image, with --image; None: the pods run as local processes.
PODMAN = None
IMAGE = None
# What a `podman exec` may take beyond the probe's own timeoutSeconds.
PODMAN_EXEC_SLACK_S = 30


def flags_of(binary):
    """The flag names `binary --helpfull` lists, absl's own left out."""
    if binary not in _flags_cache:
        argv = [binary, "--helpfull"]
        if IMAGE:
            argv = PODMAN + ["run", "--rm", "--network", "none", IMAGE] + argv
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        names, from_absl = set(), False
        for line in (out.stdout + out.stderr).splitlines():
            section = re.match(r"\s*Flags from (\S+):", line)
            if section:
                from_absl = "absl/" in section.group(1)
                continue
            m = re.match(r"    --([A-Za-z0-9_]+) ", line)
            if m and not from_absl:
                names.add(m.group(1))
        if not names:
            raise ManifestError("%s --helpfull listed no flags" % binary)
        _flags_cache[binary] = names - ABSL_FLAGS
    return _flags_cache[binary]


class Pod:
    def __init__(self, name, owner, template, index=None):
        self.name = name
        self.owner = owner  # (kind, name)
        meta = template.get("metadata", {})
        self.labels = dict(meta.get("labels", {}))
        self.annotations = dict(meta.get("annotations", {}))
        self.spec = template["spec"]
        self.index = index
        self.ip = None
        self.extra_env = {}
        self.hostnames = []
        # A StatefulSet's volumeClaimTemplates: volume name -> the claim the
        # controller makes for this pod ("<template>-<pod>").
        self.claims = {}


def expand_pods(objects):
    pods = []
    for o in objects:
        kind, name, spec = o["kind"], o["metadata"]["name"], o.get("spec", {})
        if kind == "Deployment":
            for i in range(spec.get("replicas", 1)):
                pods.append(Pod("%s-%d" % (name, i), (kind, name), spec["template"]))
        elif kind == "StatefulSet":
            for i in range(spec.get("replicas", 1)):
                p = Pod("%s-%d" % (name, i), (kind, name), spec["template"], i)
                p.labels["apps.kubernetes.io/pod-index"] = str(i)
                p.labels["statefulset.kubernetes.io/pod-name"] = p.name
                if spec.get("serviceName"):
                    p.hostnames.append("%s.%s" % (p.name, spec["serviceName"]))
                for t in spec.get("volumeClaimTemplates", []):
                    p.claims[t["metadata"]["name"]] = "%s-%s" % (t["metadata"]["name"], p.name)
                pods.append(p)
        elif kind == "Job":
            completions = spec.get("completions", 1)
            if spec.get("parallelism", 1) != completions:
                raise ManifestError("Job %s: parallelism %s != completions %s: not every "
                                    "worker would run at once" % (
                                        name, spec.get("parallelism", 1), completions))
            for i in range(completions):
                p = Pod("%s-%d" % (name, i), (kind, name), spec["template"], i)
                if spec.get("completionMode") == "Indexed":
                    p.annotations["batch.kubernetes.io/job-completion-index"] = str(i)
                    p.labels["batch.kubernetes.io/job-completion-index"] = str(i)
                    p.extra_env["JOB_COMPLETION_INDEX"] = str(i)
                pods.append(p)
        elif kind in ("Pod", "DaemonSet", "ReplicaSet", "CronJob"):
            raise ManifestError("%s %s: this test does not run a %s" % (kind, name, kind))
    return pods


def data_of(obj):
    """A ConfigMap's or Secret's data as text."""
    data = dict(obj.get("data") or {})
    if obj["kind"] == "Secret":
        data = {k: base64.b64decode(v).decode() for k, v in data.items()}
        data.update(obj.get("stringData") or {})
    return {k: str(v) for k, v in data.items()}


def expand_refs(text, env):
    """Kubernetes' $(VAR) expansion: known variables replaced, $$ an escaped $."""
    def repl(m):
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", repl, text)


def field_ref(pod, path):
    m = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if m:
        return (pod.labels if m.group(1) == "labels" else pod.annotations).get(m.group(2), "")
    simple = {"metadata.name": pod.name, "metadata.namespace": NAMESPACE,
              "metadata.uid": "uid-" + pod.name, "spec.nodeName": "localhost",
              "spec.serviceAccountName": pod.spec.get("serviceAccountName", "default"),
              "status.podIP": pod.ip or "", "status.podIPs": pod.ip or "",
              "status.hostIP": "127.0.0.1", "status.hostIPs": "127.0.0.1"}
    if path not in simple:
        raise ManifestError("pod %s: fieldRef %s is not one this test knows" % (pod.name, path))
    return simple[path]


def quantity(value, divisor):
    """resourceFieldRef: a quantity in units of `divisor`, rounded up (cpu: cores)."""
    units = {"m": 1e-3, "": 1, "k": 1e3, "M": 1e6, "G": 1e9, "Ki": 1024, "Mi": 1024 ** 2,
             "Gi": 1024 ** 3}
    def parse(q):
        m = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(q))
        return float(m.group(1)) * units[m.group(2)]
    return str(int(-(-parse(value) // parse(divisor or "1"))))


def service_links(objects_by_kind):
    """The variables the kubelet gives every pod for each Service with a
    cluster IP (unless enableServiceLinks is false): grps-coordinator gives
    GRPS_COORDINATOR_SERVICE_HOST, GRPS_COORDINATOR_PORT, ..., in the
    daemons' own GRPS_ namespace."""
    env = {}
    for svc in objects_by_kind.get("Service", {}).values():
        if svc["spec"].get("clusterIP") == "None":
            continue
        name = svc["metadata"]["name"].upper().replace("-", "_")
        ports = svc["spec"].get("ports", [])
        ip = "10.0.0.1"
        env[name + "_SERVICE_HOST"] = ip
        for i, port in enumerate(ports):
            proto = port.get("protocol", "TCP")
            if i == 0:
                env[name + "_SERVICE_PORT"] = str(port["port"])
                env[name + "_PORT"] = "%s://%s:%d" % (proto.lower(), ip, port["port"])
            if port.get("name"):
                env["%s_SERVICE_PORT_%s" % (name, port["name"].upper().replace("-", "_"))] = \
                    str(port["port"])
            prefix = "%s_PORT_%d_%s" % (name, port["port"], proto)
            env[prefix] = "%s://%s:%d" % (proto.lower(), ip, port["port"])
            env[prefix + "_PROTO"] = proto.lower()
            env[prefix + "_PORT"] = str(port["port"])
            env[prefix + "_ADDR"] = ip
    return env


def container_env(pod, container, objects_by_kind):
    env = dict(pod.extra_env)
    env["HOSTNAME"] = pod.name
    if pod.spec.get("enableServiceLinks", True):
        env.update(service_links(objects_by_kind))
    where = "pod %s container %s" % (pod.name, container["name"])

    def lookup(kind, name, optional):
        obj = objects_by_kind.get(kind, {}).get(name)
        if obj is None and not optional:
            raise ManifestError("%s: %s %s does not exist" % (where, kind, name))
        return obj

    for source in container.get("envFrom", []):
        prefix = source.get("prefix", "")
        for kind, key in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
            if key in source:
                ref = source[key]
                obj = lookup(kind, ref["name"], ref.get("optional", False))
                if obj is not None:
                    for k, v in data_of(obj).items():
                        env[prefix + k] = v
    for var in container.get("env", []):
        name = var["name"]
        if "value" in var:
            env[name] = expand_refs(str(var["value"]), env)
            continue
        source = var.get("valueFrom", {})
        if "fieldRef" in source:
            env[name] = field_ref(pod, source["fieldRef"]["fieldPath"])
        elif "resourceFieldRef" in source:
            ref = source["resourceFieldRef"]
            kind, res = ref["resource"].split(".", 1)
            value = container.get("resources", {}).get(kind, {}).get(res)
            if value is None:
                raise ManifestError("%s: %s: no %s set" % (where, name, ref["resource"]))
            env[name] = quantity(value, ref.get("divisor"))
        else:
            for kind, key in (("ConfigMap", "configMapKeyRef"), ("Secret", "secretKeyRef")):
                if key in source:
                    ref = source[key]
                    obj = lookup(kind, ref["name"], ref.get("optional", False))
                    if obj is None:
                        break
                    data = data_of(obj)
                    if ref["key"] not in data:
                        if ref.get("optional", False):
                            break
                        raise ManifestError("%s: %s: %s %s has no key %s"
                                            % (where, name, kind, ref["name"], ref["key"]))
                    env[name] = data[ref["key"]]
                    break
            else:
                raise ManifestError("%s: %s: a valueFrom this test does not know" % (where, name))
    return env


def binary_of(program, bin_dir, where):
    if program == IMAGE_PYTHON:
        # Debian's python3 here is the image's (Debian 12, the same package).
        if not IMAGE and not os.access(IMAGE_PYTHON, os.X_OK):
            raise ManifestError("%s: %s: not on this machine" % (where, IMAGE_PYTHON))
        return IMAGE_PYTHON
    if not program or not program.startswith(IMAGE_BIN):
        raise ManifestError("%s: runs %r, not a program of the image (%s...)"
                            % (where, program, IMAGE_BIN))
    if IMAGE:
        return program  # flags_of fails for a program the image lacks
    local = os.path.join(bin_dir, program[len(IMAGE_BIN):])
    if not os.access(local, os.X_OK):
        raise ManifestError("%s: %s: no such program in %s" % (where, program, bin_dir))
    return local


def flag_problems(where, binary, env, argv):
    """Variables and arguments that name no flag of `binary`."""
    known = flags_of(binary)
    name = os.path.basename(binary)
    problems = []
    for var in sorted(env):
        if var.startswith("GRPS_") and var[5:].lower() not in known:
            problems.append("%s: %s names no flag of %s (a daemon ignores it silently)"
                            % (where, var, name))
    for arg in argv[1:]:
        if not arg.startswith("-"):
            continue
        flag = arg.lstrip("-").split("=", 1)[0].replace("-", "_")
        if flag not in known and not (flag.startswith("no") and flag[2:] in known):
            problems.append("%s: argument %s names no flag of %s" % (where, arg, name))
    return problems


def python_problems(where, env):
    """Variables a Python worker would not read (see PYTHON_WORKER_VARIABLES)."""
    return ["%s: %s is no variable a Python worker (grps.torch) reads" % (where, var)
            for var in sorted(env)
            if var.startswith("GRPS_") and var not in PYTHON_WORKER_VARIABLES]


def torchrun_problems(where, env, workers):
    """torchrun's variables of a Python worker's pod, one process alone on
    its pod among `workers` (the Job's completions)."""
    expected = {"RANK": env.get("GRPS_RANK"), "WORLD_SIZE": str(workers),
                "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                "GRPS_LOCAL_RANK": "0", "GRPS_LOCAL_SIZE": "1"}
    return ["%s: %s=%s, not %s" % (where, var, env.get(var, "(unset)"), value)
            for var, value in expected.items() if env.get(var) != value]


def check_script(pod, container, argv, by_kind, examples, where):
    """A Python container's script (its first argument that is not an
    option) is one of the image's examples (the repository's examples/), or
    a key of a ConfigMap volume mounted where the script is."""
    scripts = [a for a in argv[1:] if not a.startswith("-")]
    if not scripts:
        raise ManifestError("%s: %s runs no script" % (where, argv[0]))
    script = scripts[0]
    if script.startswith(IMAGE_EXAMPLES + "/"):
        local = os.path.join(examples, script[len(IMAGE_EXAMPLES) + 1:])
        if not os.path.isfile(local):
            raise ManifestError("%s: %s: no such example in %s" % (where, script, examples))
        return
    volumes = {v["name"]: v for v in pod.spec.get("volumes", [])}
    for m in container.get("volumeMounts", []):
        mount = m["mountPath"].rstrip("/") + "/"
        ref = volumes.get(m["name"], {}).get("configMap")
        if not script.startswith(mount) or ref is None:
            continue
        key = script[len(mount):]
        obj = by_kind.get("ConfigMap", {}).get(ref["name"])
        items = {i["path"]: i["key"] for i in ref.get("items") or []} or \
            {k: k for k in data_of(obj or {"kind": "ConfigMap"})}
        if obj is None or key not in items:
            raise ManifestError("%s: %s: ConfigMap %s mounted at %s has no %s"
                                % (where, script, ref["name"], m["mountPath"], key))
        return
    raise ManifestError("%s: script %s is neither one of the image's examples (%s) nor a "
                        "file of a ConfigMap volume" % (where, script, IMAGE_EXAMPLES))


def index_objects(objects):
    by_kind = {}
    for o in objects:
        by_kind.setdefault(o["kind"], {})[o["metadata"]["name"]] = o
    return by_kind


def check_counts(objects):
    by_kind = index_objects(objects)
    problems = []
    coordinator_env = {}
    for o in by_kind.get("ConfigMap", {}).values():
        for k, v in data_of(o).items():
            if k in ("GRPS_SERVERS", "GRPS_WORKERS"):
                coordinator_env[k] = int(v)
    servers = [o["spec"].get("replicas", 1) for o in by_kind.get("StatefulSet", {}).values()]
    jobs = [o["spec"] for o in by_kind.get("Job", {}).values()]
    if "GRPS_SERVERS" in coordinator_env and servers != [coordinator_env["GRPS_SERVERS"]]:
        problems.append("GRPS_SERVERS=%d but the StatefulSet has %s replicas"
                        % (coordinator_env["GRPS_SERVERS"], servers))
    if "GRPS_WORKERS" in coordinator_env and \
            [j.get("completions", 1) for j in jobs] != [coordinator_env["GRPS_WORKERS"]]:
        problems.append("GRPS_WORKERS=%d but the Job has completions %s"
                        % (coordinator_env["GRPS_WORKERS"], [j.get("completions", 1) for j in jobs]))
    return problems


class Step:
    """One --scale or --exec step (see the docstring), as planned."""

    def __init__(self, option, text):
        self.option = option  # "scale" or "exec"
        self.text = text
        self.start = []  # --scale: the pods of the new indexes
        self.remove = []  # --scale down: the pods taken out of the set
        self.pod = None  # --exec: the pod it runs in
        self.command = []  # --exec: its command

    def __str__(self):
        return "--%s %s" % (self.option, self.text)


class StepAction(argparse.Action):
    """--scale and --exec into one list, in the order given."""

    def __call__(self, parser, namespace, value, option_string=None):
        namespace.steps = (namespace.steps or []) + [Step(self.dest, value)]


def exec_target(target, objects):
    """kubectl exec's POD: a pod's name, or deployment/NAME (deploy/NAME),
    whose pod is NAME-0 here."""
    kind, _, name = target.rpartition("/")
    if not kind:
        return target
    if kind not in ("deploy", "deployment", "deployments"):
        raise ManifestError("--exec %s: a pod or deployment/NAME" % target)
    if not any(o["kind"] == "Deployment" and o["metadata"]["name"] == name for o in objects):
        raise ManifestError("--exec %s: no Deployment %s" % (target, name))
    return name + "-0"


def plan_steps(objects, steps):
    """Checks the steps against the workloads of `objects`, and fills in
    what each does. Each scaled workload's spec is set to the most it is
    scaled to, so that expand_pods makes every pod a step starts. Returns
    (the pods not started at first, workload name -> its count after the
    last step)."""
    workloads = {o["metadata"]["name"]: o for o in objects if o["kind"] in ("Job", "StatefulSet")}
    count = {name: o["spec"].get("completions" if o["kind"] == "Job" else "replicas", 1)
             for name, o in workloads.items()}
    most = dict(count)
    held, gone = [], set()
    for step in steps:
        if step.option == "exec":
            target, sep, command = step.text.partition(" -- ")
            step.pod, step.command = exec_target(target.strip(), objects), shlex.split(command)
            if not sep or not step.command:
                raise ManifestError("%s: not 'POD -- COMMAND...'" % step)
            continue
        name, _, n = step.text.partition("=")
        if name not in workloads or not n.isdigit() or int(n) < 1:
            raise ManifestError("%s: no Job or StatefulSet %s, or not NAME=N (N >= 1)"
                                % (step, name))
        o, n = workloads[name], int(n)
        if o["kind"] == "Job" and (o["spec"].get("completionMode") != "Indexed" or
                                   n <= count[name]):
            raise ManifestError("%s: the Job is not indexed, or N is not above its %d "
                                "completions (a Job's pods leave with --evict)"
                                % (step, count[name]))
        step.start = ["%s-%d" % (name, i) for i in range(count[name], n)]
        step.remove = ["%s-%d" % (name, i) for i in range(n, count[name])][::-1]
        again = gone.intersection(step.start)
        if again:
            raise ManifestError("%s: %s taken out by an earlier step: this test does not "
                                "start a pod again" % (step, ", ".join(sorted(again))))
        gone.update(step.remove)
        held += step.start
        count[name], most[name] = n, max(most[name], n)
    for name, o in workloads.items():
        if o["kind"] == "Job":
            o["spec"]["completions"] = o["spec"]["parallelism"] = most[name]
        else:
            o["spec"]["replicas"] = most[name]
    return held, count


def check_manifest(path, secrets, bin_dir, examples, steps=()):
    """Static checks of one rendered overlay; returns (pods with their
    containers' argv and env, problems). With `steps`, the workloads are
    scaled after the checks of the counts (plan_steps)."""
    objects = load(path) + secrets
    by_kind = index_objects(objects)
    problems = check_counts(objects)
    # The Jobs' sizes the job starts with, before any step scales them.
    completions = {name: o["spec"].get("completions", 1)
                   for name, o in by_kind.get("Job", {}).items()}
    if steps:
        plan_steps(objects, steps)
    pods = expand_pods(objects)
    runs = []
    for pod in pods:
        pod.ip = "0.0.0.0"  # fieldRef status.podIP before an address is chosen
        if len(pod.spec.get("containers", [])) != 1:
            raise ManifestError("pod %s: %d containers; this test runs pods of one"
                                % (pod.name, len(pod.spec.get("containers", []))))
        for c in pod.spec.get("containers", []):
            where = "%s: %s %s container %s" % (os.path.basename(path), pod.owner[0],
                                                 pod.owner[1], c["name"])
            env = container_env(pod, c, by_kind)
            argv = [expand_refs(a, env) for a in c.get("command", []) + c.get("args", [])]
            if not c.get("command"):
                raise ManifestError("%s: no command (no wrapper, no image ENTRYPOINT: name "
                                    "the program)" % where)
            binary = binary_of(argv[0], bin_dir, where)
            if binary == IMAGE_PYTHON:
                # The script's arguments are its own.
                check_script(pod, c, argv, by_kind, examples, where)
                problems += python_problems(where, env)
                if pod.owner[0] == "Job":
                    problems += torchrun_problems(where, env, completions[pod.owner[1]])
            else:
                problems += flag_problems(where, binary, env, argv)
            for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
                if "grpc" in c.get(kind, {}) and env.get("GRPS_TLS_CERT"):
                    problems.append("%s: %s: Kubernetes' grpc probe cannot speak TLS, and "
                                    "this container serves TLS (GRPS_TLS_CERT): use an exec "
                                    "probe (grpsctl health)" % (where, kind))
                if "exec" in c.get(kind, {}):
                    command = [expand_refs(a, env) for a in c[kind]["exec"]["command"]]
                    probe_binary = binary_of(command[0], bin_dir, "%s %s" % (where, kind))
                    problems += [p for p in flag_problems("%s %s" % (where, kind), probe_binary,
                                                          {}, command)]
            runs.append((pod, c, binary, argv, env))
    # Once per workload, not once per pod.
    return objects, runs, list(dict.fromkeys(problems))


class Resolver:
    """Service and pod DNS names, and 0.0.0.0, to the pods' loopback addresses."""

    def __init__(self, objects, pods):
        self.names = {}
        for pod in pods:
            for h in pod.hostnames:
                self.names[h] = pod.ip
        for svc in index_objects(objects).get("Service", {}).values():
            selector = svc["spec"].get("selector") or {}
            chosen = [p for p in pods if selector and
                      all(p.labels.get(k) == v for k, v in selector.items())]
            if len(chosen) == 1:
                self.names[svc["metadata"]["name"]] = chosen[0].ip
            elif len(chosen) > 1:
                # Several pods behind one name: a headless Service's pods are
                # reached by their own names; this name maps to none.
                self.names.setdefault(svc["metadata"]["name"], None)
        names = sorted(self.names, key=len, reverse=True)
        self.pattern = re.compile(
            r"(?<![\w.-])(%s)(?:\.[a-z0-9-]+(?:\.svc(?:\.cluster\.local)?)?)?(?![\w.-])"
            % "|".join(re.escape(n) for n in names)) if names else None

    def rewrite(self, text, pod, where, names=True):
        """0.0.0.0 to the pod's address, and (with `names`) every DNS name to
        the address of the pod it resolves to."""
        text = re.sub(r"(?<![\w.])(0\.0\.0\.0|\[::\])(?=:\d)", pod.ip, text)
        if self.pattern is None or not names:
            return text

        def repl(m):
            ip = self.names[m.group(1)]
            if ip is None:
                raise ManifestError("%s: %s names a Service of several pods; use one "
                                    "pod's DNS name" % (where, m.group(0)))
            return ip
        return self.pattern.sub(repl, text)

    def hosts(self, text):
        """The DNS names in `text` (as written there) with their addresses:
        the /etc/hosts entries a container needs to resolve them."""
        if self.pattern is None:
            return {}
        return {m.group(0): self.names[m.group(1)] for m in self.pattern.finditer(text)
                if self.names[m.group(1)] is not None}


def choose_addresses(pods, ports_of):
    """A loopback address per pod where every port the pod declares is free."""
    for _ in range(20):
        a, b = random.randint(10, 250), random.randint(1, 250)
        ips = ["127.%d.%d.%d" % (a, b, n + 1) for n in range(len(pods))]
        if all(port_free(ip, port) for pod, ip in zip(pods, ips) for port in ports_of(pod)):
            for pod, ip in zip(pods, ips):
                pod.ip = ip
            return
    raise RuntimeError("found no loopback range with the pods' ports free")


def port_free(ip, port):
    s = socket.socket()
    try:
        s.bind((ip, port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def volume_dirs(pod, objects_by_kind, work):
    """Mount path -> local folder, for every volume mount of the pod's containers."""
    dirs = {}
    # Each pod's own claims first: a pod volume of the same name is an error
    # here (Kubernetes would quietly use the claim).
    templated = [{"name": name, "persistentVolumeClaim": {"claimName": claim}}
                 for name, claim in sorted(pod.claims.items())]
    for vol in pod.spec.get("volumes", []):
        if vol["name"] in pod.claims:
            raise ManifestError("pod %s: volume %s is also a volumeClaimTemplate"
                                % (pod.name, vol["name"]))
    for vol in templated + pod.spec.get("volumes", []):
        if vol["name"] in pod.claims:
            path = os.path.join(work, "volumes", "pvc-" + pod.claims[vol["name"]])
        elif "persistentVolumeClaim" in vol:
            claim = vol["persistentVolumeClaim"]["claimName"]
            if claim not in objects_by_kind.get("PersistentVolumeClaim", {}):
                raise ManifestError("pod %s: claim %s is not in the manifests" % (pod.name, claim))
            path = os.path.join(work, "volumes", "pvc-" + claim)
        elif "secret" in vol or "configMap" in vol:
            kind, ref = ("Secret", vol["secret"]) if "secret" in vol else ("ConfigMap", vol["configMap"])
            name = ref.get("secretName") or ref.get("name")
            obj = objects_by_kind.get(kind, {}).get(name)
            if obj is None:
                raise ManifestError("pod %s: volume %s: %s %s does not exist"
                                    % (pod.name, vol["name"], kind, name))
            path = os.path.join(work, "volumes", "%s-%s-%s" % (pod.name, kind.lower(), name))
            os.makedirs(path, exist_ok=True)
            data = data_of(obj)
            items = ref.get("items") or [{"key": k, "path": k} for k in data]
            for item in items:
                target = os.path.join(path, item["path"])
                with open(target, "w") as f:
                    f.write(data[item["key"]])
                os.chmod(target, 0o600)
        elif "emptyDir" in vol:
            path = os.path.join(work, "volumes", "%s-%s" % (pod.name, vol["name"]))
        else:
            raise ManifestError("pod %s: volume %s: a kind this test does not know"
                                % (pod.name, vol["name"]))
        created = not os.path.isdir(path)
        os.makedirs(path, exist_ok=True)
        if IMAGE:
            own_volume(path, pod, vol, created)
        dirs[vol["name"]] = path
    mounts = {}
    for c in pod.spec.get("containers", []):
        for m in c.get("volumeMounts", []):
            if m["name"] not in dirs:
                raise ManifestError("pod %s: mount of unknown volume %s" % (pod.name, m["name"]))
            local = dirs[m["name"]]
            if m.get("subPath"):
                local = os.path.join(local, m["subPath"])
            mounts[m["mountPath"].rstrip("/")] = local
    return mounts


def own_volume(path, pod, vol, created):
    """What the kubelet does to a volume for a pod's securityContext. With
    fsGroup, the volume's group is fsGroup: a claim's and an emptyDir's
    folder writable by it (set-group-id), a Secret's or ConfigMap's files
    root's, of group fsGroup, with the volume's defaultMode. Without, a claim
    stays as it is (a new one as a provisioner makes it: root's, 0755), an
    emptyDir is open to all, and a Secret's files are root's alone with
    their defaultMode."""
    group = pod.spec.get("securityContext", {}).get("fsGroup")
    ref = vol.get("secret") or vol.get("configMap")
    if ref is None:
        if created:
            os.chown(path, 0, 0)
            os.chmod(path, 0o1777 if "emptyDir" in vol else 0o755)
        if group is not None:
            os.chown(path, 0, group)
            os.chmod(path, 0o2775)
        return
    os.chown(path, 0, 0)
    os.chmod(path, 0o755)
    for name in os.listdir(path):
        os.chown(os.path.join(path, name), 0, group or 0)
        os.chmod(os.path.join(path, name), ref.get("defaultMode", 0o644))


def check_checkpoint_volumes(volumes, shards, own_claims):
    """The newest checkpoint with a MANIFEST has every shard's file on some
    volume, shard K's on pod K's own claim when the servers have claims of
    their own (`own_claims`: K -> volume folder names), and a coordinator
    state file is there. Failures, as messages."""
    found = {}  # ckpt-N -> {file name: volume}
    states = []
    for d, _, files in os.walk(volumes):
        for f in files:
            volume = os.path.relpath(d, volumes).split(os.sep)[0]
            if f == "coordinator.state":
                states.append(volume)
            elif os.path.basename(d).startswith("ckpt-") and (f == "MANIFEST" or f.endswith(".ckpt")):
                found.setdefault(os.path.basename(d), {})[f] = volume
    complete = sorted(n for n, files in found.items() if "MANIFEST" in files)
    if not complete or not states:
        return ["no complete checkpoint or no coordinator state file on a volume"]
    newest = complete[-1]
    files = found[newest]
    print("checkpoint volumes: %d complete checkpoints; %s: %s; state file on %s" % (
        len(complete), newest, ", ".join("%s on %s" % (f, v) for f, v in sorted(files.items())),
        states[0]))
    missing = ["shard-%05d.ckpt" % k for k in range(shards) if "shard-%05d.ckpt" % k not in files]
    if missing:
        return ["%s has a MANIFEST but no %s on any volume" % (newest, " ".join(missing))]
    return ["%s: shard-%05d.ckpt is on %s, not on its pod's own claim (%s)"
            % (newest, k, files["shard-%05d.ckpt" % k], " ".join(sorted(own_claims[k])))
            for k in range(shards)
            if own_claims.get(k) and files["shard-%05d.ckpt" % k] not in own_claims[k]]


def podman_argv(pod, container, cname, env, argv, hosts, mounts):
    """`podman run` of one container, as the kubelet would run it: `env` its
    environment, `mounts` mount path -> local folder (volume_dirs)."""
    ctx = pod.spec.get("securityContext", {})
    cctx = container.get("securityContext", {})
    out = PODMAN + ["run", "--rm", "--name", cname, "--network", "host", "--pull", "never"]
    user = cctx.get("runAsUser", ctx.get("runAsUser"))
    if user is not None:
        out += ["--user", "%d:%d" % (user, cctx.get("runAsGroup", ctx.get("runAsGroup", user)))]
    if "fsGroup" in ctx:
        out += ["--group-add", str(ctx["fsGroup"])]
    if cctx.get("readOnlyRootFilesystem"):
        out += ["--read-only"]
    if "ALL" in cctx.get("capabilities", {}).get("drop", []):
        out += ["--cap-drop", "ALL"]
    if cctx.get("allowPrivilegeEscalation") is False:
        out += ["--security-opt", "no-new-privileges"]
    for name, ip in sorted(hosts.items()):
        out += ["--add-host", "%s:%s" % (name, ip)]
    read_only = {m["mountPath"].rstrip("/") for m in container.get("volumeMounts", [])
                 if m.get("readOnly")}
    for mount, local in sorted(mounts.items()):
        out += ["--volume", "%s:%s%s" % (local, mount, ":ro" if mount in read_only else "")]
    for k, v in sorted(env.items()):
        out += ["--env", "%s=%s" % (k, v)]
    return out + [IMAGE] + argv


def rewrite_paths(text, mounts):
    """Each mount path in `text` (the longest that matches) to its local
    folder, in one pass: a folder that is itself under a mount path (a work
    folder in /tmp, with a volume mounted at /tmp) is not rewritten again."""
    if not mounts:
        return text
    pattern = r"(?<![\w/.-])(%s)(?=/|$|,|:)" % "|".join(
        re.escape(m) for m in sorted(mounts, key=len, reverse=True))
    return re.sub(pattern, lambda m: mounts[m.group(1)], text)


def checkpoint_complete(logs, training=False):
    """The id of the newest checkpoint the coordinator (its log, logs[0])
    said is complete, or None; with `training`, None too once it said
    training is done (a restart must land while the job trains)."""
    if not logs or not os.path.exists(logs[0]):
        return None
    text = open(logs[0], errors="replace").read()
    if training and "training done" in text:
        return None
    ids = re.findall(r"checkpoint (\d+) complete at step", text)
    return ids[-1] if ids else None


def restart_pod(runner, name, argv, env, cname):
    """Kills pod `name`'s process (its container, with --image) with SIGKILL
    and starts it again as it was, logging to NAME.restarted.log. Returns
    the checkpoint it was killed after."""
    after = checkpoint_complete([runner.logs[n] for n in runner.logs
                                 if n.startswith("grps-coordinator")])
    p = runner.procs[name]
    if IMAGE:
        subprocess.run(PODMAN + ["kill", "--signal", "KILL", cname],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
    else:
        p.kill()
    p.wait(60)
    runner.start(name, argv, env, cname, log_name=name + ".restarted")
    return after


def evict_pod(runner, name, cname):
    """What Kubernetes does to a pod it evicts, or to a Job's pod when the Job
    is scaled down: SIGTERM to its process (its container, with --image)."""
    if IMAGE:
        subprocess.run(PODMAN + ["kill", "--signal", "TERM", cname],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
    else:
        runner.procs[name].terminate()


def _die_with_parent():
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Runner:
    def __init__(self, work):
        self.work = work
        self.procs = {}  # pod name -> Popen
        self.logs = {}
        self.containers = []  # podman's names, with --image

    def start(self, pod_name, argv, env, container_name=None, log_name=None):
        log = os.path.join(self.work, (log_name or pod_name) + ".log")
        self.logs[pod_name] = log
        if container_name and container_name not in self.containers:
            self.containers.append(container_name)
        cwd = os.path.join(self.work, "cwd", pod_name)
        os.makedirs(cwd, exist_ok=True)
        with open(log, "w") as f:
            self.procs[pod_name] = subprocess.Popen(
                argv, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=cwd,
                preexec_fn=_die_with_parent)

    def stop_all(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        deadline = time.time() + 3
        for p in self.procs.values():
            try:
                p.wait(max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if self.containers:
            subprocess.run(PODMAN + ["rm", "--force", "--ignore", "--time", "1"] + self.containers,
                           capture_output=True, timeout=60)

    def tail(self, pod_name, lines=15):
        try:
            with open(self.logs[pod_name], errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""


def local_env(env):
    """The container's environment, and what a process needs to run here."""
    out = {k: v for k, v in env.items()}
    for k in ("PATH", "LD_LIBRARY_PATH", "TMPDIR"):
        if k in os.environ and k not in out:
            out[k] = os.environ[k]
    return out


def probe_once(probe, pod, argv_of, env, timeout):
    if "exec" in probe:
        argv = argv_of(probe["exec"]["command"], timeout)
        # In the image the probe's own limit is kept inside the container
        # (argv_of); podman's start of the exec session, seconds on a busy
        # machine, is not the probe's time.
        r = subprocess.run(argv, env=env, capture_output=True, text=True,
                           timeout=timeout + (PODMAN_EXEC_SLACK_S if IMAGE else 0),
                           preexec_fn=_die_with_parent)
        return r.returncode == 0, (r.stdout + r.stderr).strip()
    if "tcpSocket" in probe:
        try:
            socket.create_connection((pod.ip, int(probe["tcpSocket"]["port"])), timeout).close()
            return True, "connected"
        except OSError as e:
            return False, str(e)
    if "httpGet" in probe:
        h = probe["httpGet"]
        try:
            with urllib.request.urlopen("http://%s:%s%s" % (pod.ip, h["port"], h.get("path", "/")),
                                        timeout=timeout) as r:
                return 200 <= r.status < 400, "HTTP %d" % r.status
        except OSError as e:
            return False, str(e)
    raise ManifestError("pod %s: a probe this test does not run: %s" % (pod.name, list(probe)))


def run(args, objects, runs):
    work = args.work
    os.makedirs(work, exist_ok=True)
    by_kind = index_objects(objects)
    pods = []
    for pod, *_ in runs:
        if pod not in pods:
            pods.append(pod)

    def ports_of(pod):
        return [p["containerPort"] for c in pod.spec.get("containers", []) for p in c.get("ports", [])]
    choose_addresses(pods, ports_of)
    resolver = Resolver(objects, pods)
    for pod in pods:
        print("pod %-20s %s%s" % (pod.name, pod.ip,
                                  " (%s)" % ", ".join(pod.hostnames) if pod.hostnames else ""))

    # Each container's final command and environment, as run here.
    started = []
    hosts = {}  # with --image: every DNS name written in a manifest -> address
    in_image = {}  # with --image: pod name -> its container's (env, mounts)
    for pod, container, binary, _, _ in runs:
        where = "pod %s container %s" % (pod.name, container["name"])
        env = container_env(pod, container, by_kind)  # again: status.podIP is known now
        mounts = volume_dirs(pod, by_kind, work)
        python = binary == IMAGE_PYTHON
        # Here the image's examples are the repository's.
        paths = dict(mounts, **({IMAGE_EXAMPLES: args.examples} if python else {}))

        def local(text, pod=pod, paths=paths, where=where):
            if IMAGE:
                hosts.update(resolver.hosts(text))
                return resolver.rewrite(text, pod, where, names=False)
            return rewrite_paths(resolver.rewrite(text, pod, where), paths)
        env = {k: (local(v) if k.startswith("GRPS_") else v) for k, v in env.items()}
        argv = [expand_refs(a, env) for a in container.get("command", []) + container.get("args", [])]
        argv = [binary] + [local(a) for a in argv[1:]]
        cname = "grps-pods-%d-%s" % (os.getpid(), pod.name) if IMAGE else None

        # A probe runs in the pod's network namespace, where 127.0.0.1 is the
        # pod itself: here, its address.
        def argv_of(command, timeout, env=env, local=local, where=where, pod=pod, cname=cname):
            command = [expand_refs(a, env) for a in command]
            command = [re.sub(r"(?<![\w.])(127\.0\.0\.1|localhost)(?=:\d)", pod.ip, a)
                       for a in command]
            command = [binary_of(command[0], args.bin, where)] + [local(a) for a in command[1:]]
            if IMAGE:
                return PODMAN + ["exec", cname, "timeout", "%g" % timeout] + command
            return command
        if IMAGE:
            in_image[pod.name] = (env, mounts)
        if python and not IMAGE:
            # The build's grps package, which the image installs; and no
            # __pycache__ in the repository's examples or a volume.
            env = dict(env, PYTHONPATH=args.python_dir, PYTHONDONTWRITEBYTECODE="1")
        started.append((pod, container, argv, local_env({} if IMAGE else env), argv_of, cname))

    runner = Runner(work)
    begin = time.time()
    probes_ok, scraped, codes = {}, {}, {}
    raced = set()  # (pod, probe kind): a probe that failed as its container exited
    wall = 0.0
    restarted = None  # with --restart: the checkpoint it was killed after
    evicted = None  # with --evict: the checkpoint it was sent SIGTERM after
    steps = list(args.steps)  # the steps still to run, in order
    done = []  # (step, the checkpoint it ran after)
    after = None  # the checkpoint complete when the last step ended
    execing = None  # (the --exec step running, its process, its log)
    removed = {}  # pod name -> how a scale-down took it out
    step_failures = []
    try:
        launched = {}  # pod name -> what runner.start was given

        def launch(pod, container, argv, env, cname):
            if IMAGE:
                image_env, mounts = in_image[pod.name]
                argv = podman_argv(pod, container, cname, image_env, argv, hosts, mounts)
            runner.start(pod.name, argv, env, cname)
            launched[pod.name] = (argv, env, cname)
        for pod, container, argv, env, _, cname in started:
            if pod.name not in args.held:  # started by a --scale step
                launch(pod, container, argv, env, cname)
        by_name = {entry[0].name: entry for entry in started}
        lock = threading.Lock()
        stop = threading.Event()

        def watch(pod, container, env, argv_of):
            # The container's probes until each has passed once, and its
            # scrape target until it has answered once, while it runs.
            ann = pod.annotations
            kinds = [k for k in ("startupProbe", "readinessProbe", "livenessProbe")
                     if k in container]
            failed_at = {}  # kind: when its last probe failed
            while not stop.is_set() and runner.procs[pod.name].poll() is None:
                for kind in kinds:
                    if probes_ok.get((pod.name, kind), (False,))[0]:
                        continue
                    try:
                        ok, said = probe_once(container[kind], pod, argv_of, env,
                                              container[kind].get("timeoutSeconds", 1))
                    except subprocess.TimeoutExpired:
                        ok, said = False, "timed out"
                    if not ok:
                        failed_at[kind] = time.monotonic()
                    with lock:
                        probes_ok[(pod.name, kind)] = (ok, said)
                if ann.get("prometheus.io/scrape") == "true" and \
                        not scraped.get(pod.name, (False,))[0]:
                    url = "http://%s:%s%s" % (pod.ip, ann.get("prometheus.io/port", "80"),
                                               ann.get("prometheus.io/path", "/metrics"))
                    try:
                        with urllib.request.urlopen(url, timeout=2) as r:
                            body = r.read().decode(errors="replace")
                        ok = r.status == 200 and "# TYPE" in body
                        said = "%s: %d metric families" % (url, body.count("# TYPE"))
                    except OSError as e:
                        ok, said = False, "%s: %s" % (url, e)
                    with lock:
                        scraped[pod.name] = (ok, said)
                stop.wait(0.2)
            # A probe that failed within 2 s of the container's exit raced
            # it, and says nothing of it (in the image, `podman exec` finds
            # no container a moment before `podman run` itself returns).
            if runner.procs[pod.name].poll() is not None:
                for kind, at in failed_at.items():
                    if time.monotonic() - at < 2.0 and \
                            not probes_ok.get((pod.name, kind), (False,))[0]:
                        with lock:
                            raced.add((pod.name, kind))
        watchers = [threading.Thread(target=watch, args=(pod, c, env, argv_of), daemon=True)
                    for pod, c, _, env, argv_of, _ in started if pod.name not in args.held]
        for w in watchers:
            w.start()

        deadline = begin + args.timeout
        restart = {name: launched[name] for name in launched if name == args.restart}
        if args.restart and not restart:
            raise ManifestError("--restart %s: no such pod" % args.restart)
        if args.evict and args.evict not in launched:
            raise ManifestError("--evict %s: no such pod" % args.evict)
        coordinator_log = [runner.logs[p.name] for p, c, *_ in started
                           if c["command"][0].endswith("/grps-coordinator")]
        for step in steps:
            if step.pod is not None and step.pod not in by_name:
                raise ManifestError("%s: no pod %s" % (step, step.pod))

        def scale(step):
            # The controller starts the new indexes' pods, and deletes the
            # ones past the new count (SIGTERM to those still running).
            for name in step.start:
                pod, container, argv, env, argv_of, cname = by_name[name]
                launch(pod, container, argv, env, cname)
                watchers.append(threading.Thread(
                    target=watch, args=(pod, container, env, argv_of), daemon=True))
                watchers[-1].start()
            for name in step.remove:
                if runner.procs[name].poll() is None:
                    evict_pod(runner, name, launched[name][2])
                    removed[name] = "sent SIGTERM by the scale-down"
                else:
                    removed[name] = ("exited %d before the scale-down"
                                     % runner.procs[name].returncode)
            what = ", ".join(["%s started" % ", ".join(step.start)] * bool(step.start) +
                             ["%s taken out" % ", ".join(step.remove)] * bool(step.remove))
            return what

        def start_exec(step):
            # kubectl exec: the command in the pod's container, with its
            # environment, as its exec probes run.
            pod, _, _, env, argv_of, _ = by_name[step.pod]
            if runner.procs.get(pod.name) is None or runner.procs[pod.name].poll() is not None:
                step_failures.append("%s: pod %s is not running" % (step, pod.name))
                return None
            log = os.path.join(work, "exec-%d.log" % (len(done) + 1))
            with open(log, "w") as f:
                p = subprocess.Popen(argv_of(step.command, max(1, deadline - time.time())),
                                     env=env, stdout=f, stderr=subprocess.STDOUT,
                                     preexec_fn=_die_with_parent)
            return step, p, log

        # A lookup service (`grps-server --serve`) serves until it is
        # stopped: the run ends when every other pod has exited.
        serving = {p.name for p, c, *_ in started if "--serve" in c["command"]}

        def others_running():
            return any(n not in codes and n not in serving for n in runner.procs)

        while (others_running() or execing is not None) and time.time() < deadline:
            # The newest checkpoint, while a step or an eviction waits for one.
            newest = (checkpoint_complete(coordinator_log, True)
                      if (steps and execing is None) or (args.evict and evicted is None)
                      else None)
            if execing is not None and execing[1].poll() is not None:
                step, p, log = execing
                execing = None
                said = open(log, errors="replace").read().strip()
                after = checkpoint_complete(coordinator_log)
                print("%6.1f s  %s exited %d: %s" % (time.time() - begin, step, p.returncode,
                                                    said.splitlines()[-1] if said else ""))
                if p.returncode != 0:
                    step_failures.append("%s exited %d; it said:\n%s" % (step, p.returncode, said))
                    break
            if steps and execing is None and newest is not None and newest != after:
                step = steps.pop(0)
                done.append((step, newest))
                if step.option == "scale":
                    print("%6.1f s  %s after checkpoint %s: %s" % (
                        time.time() - begin, step, newest, scale(step)))
                    after = newest
                else:
                    print("%6.1f s  %s after checkpoint %s" % (time.time() - begin, step, newest))
                    execing = start_exec(step)
                    if execing is None:
                        break
            if (args.evict and evicted is None and args.evict not in codes and not steps
                    and execing is None and newest is not None and newest != after):
                evicted = newest
                evict_pod(runner, args.evict, launched[args.evict][2])
                print("%6.1f s  %s evicted (SIGTERM) after checkpoint %s" % (
                    time.time() - begin, args.evict, evicted))
            if restart and restarted is None and checkpoint_complete(coordinator_log, True):
                # What the StatefulSet does for a pod whose process died:
                # the same pod (name, ordinal, claim) started again.
                restarted = restart_pod(runner, args.restart, *restart[args.restart])
                print("%6.1f s  %s killed (SIGKILL) after checkpoint %s, started again" % (
                    time.time() - begin, args.restart, restarted))
            for name, p in runner.procs.items():
                if name not in codes and p.poll() is not None:
                    codes[name] = p.returncode
                    print("%6.1f s  %s exited %d%s" % (time.time() - begin, name, p.returncode,
                                                       " (taken out)" if name in removed else ""))
                    if p.returncode != 0 and name not in removed:
                        break
            if any(c != 0 for n, c in codes.items() if n not in removed):
                break
            time.sleep(0.1)
        wall = time.time() - begin
        # Each lookup service: it must still run, serve the job's newest
        # checkpoint within 10 s (its log says so), and exit 0 on SIGTERM
        # (the Deployment scaled down, or the pod deleted).
        newest = checkpoint_complete(coordinator_log)
        for name in sorted(serving):
            if name in codes or any(c != 0 for n, c in codes.items() if n not in removed):
                continue
            said = "serving checkpoint %s " % newest
            for _ in range(100):
                if newest is None or said in open(runner.logs[name], errors="replace").read():
                    break
                time.sleep(0.1)
            else:
                step_failures.append("%s never logged '%s' (the job's newest checkpoint)"
                                     % (name, said.strip()))
            evict_pod(runner, name, launched[name][2])
            try:
                codes[name] = runner.procs[name].wait(20)
            except subprocess.TimeoutExpired:
                pass
            else:
                print("%6.1f s  %s served checkpoint %s, exited %d on SIGTERM" % (
                    time.time() - begin, name, newest, codes[name]))
        stop.set()
        if execing is not None and execing[1].poll() is None:
            execing[1].kill()
            execing[1].wait()
            step_failures.append("%s was still running, and was stopped" % execing[0])
        for w in watchers:
            w.join(5)
    finally:
        runner.stop_all()

    failures = list(step_failures)
    failed = [n for n, c in codes.items() if c != 0 and n not in removed]
    for name in runner.procs:
        if name in failed:
            failures.insert(0, "%s exited %d (its log's tail is above)" % (name, codes[name]))
        elif name not in codes:
            failures.append("%s was still running %s, and was stopped" % (
                name, "when %s failed" % failed[0] if failed else "after %d s" % args.timeout))
    for pod, container, *_ in started:
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            if kind in container:
                ok, said = probes_ok.get((pod.name, kind), (False, "never ran"))
                if not ok and (pod.name, kind) in raced and codes.get(pod.name) == 0:
                    # A container that finished its work and exited 0 before
                    # this probe's turn (a retired server, seconds after it
                    # started): Kubernetes would not have probed it either.
                    print("probe   %-20s %-15s not run: the container exited 0 first"
                          % (pod.name, kind))
                    continue
                print("probe   %-20s %-15s %s: %s" % (pod.name, kind, "ok" if ok else "FAILED", said))
                if not ok:
                    failures.append("%s: %s never passed (%s)" % (pod.name, kind, said))
        if pod.annotations.get("prometheus.io/scrape") == "true":
            ok, said = scraped.get(pod.name, (False, "never scraped"))
            print("scrape  %-20s %s: %s" % (pod.name, "ok" if ok else "FAILED", said))
            if not ok:
                failures.append("%s: no metrics (%s)" % (pod.name, said))

    # readOnlyRootFilesystem: a process that wrote a file outside its
    # volumes would fail in the pod. Each ran in an empty folder of its own.
    for pod, container, *_ in started:
        if pod.name not in runner.procs:
            continue  # --scale's, never started
        if container.get("securityContext", {}).get("readOnlyRootFilesystem"):
            left = os.listdir(os.path.join(work, "cwd", pod.name))
            if left:
                failures.append("%s has a read-only root file system but wrote %s"
                                % (pod.name, ", ".join(left)))

    # The job's outcome, as the coordinator tells it.
    if args.restart:
        log = open(runner.logs[args.restart], errors="replace").read()
        m = re.search(r"restored (\d+) chunks.* from checkpoint (\d+) at step (\d+)", log)
        if restarted is None:
            failures.append("--restart %s: no checkpoint was complete while the job trained"
                            % args.restart)
        elif not m:
            failures.append("%s, started again, did not restore a checkpoint (its log: %s)"
                            % (args.restart, runner.logs[args.restart]))
        else:
            print("%s started again: restored %s chunks from checkpoint %s (step %s) on its "
                  "own claim" % (args.restart, m.group(1), m.group(2), m.group(3)))
    coordinator = [p for p, c, *_ in started if c["command"][0].endswith("/grps-coordinator")]
    told = (open(runner.logs[coordinator[0].name], errors="replace").read()
            if len(coordinator) == 1 else "")
    for step in steps:
        failures.append("%s did not run: no checkpoint %s was complete while the job trained"
                        % (step, "newer than %s" % after if after else "at all"))
    for step, _ in done:
        for name in step.start:
            if name not in launched:
                continue
            rank = name.rsplit("-", 1)[1]
            said = open(runner.logs[name], errors="replace").read()
            if by_name[name][0].owner[0] == "Job":
                # A new index's worker joined the running job.
                if not re.search(r"worker %s is ready to train: it joins the live set" % rank,
                                 told):
                    failures.append("%s, started by the scale-up, did not join the live set"
                                    % name)
                else:
                    print("%s started by the scale-up: worker %s joined the running job"
                          % (name, rank))
            else:
                # A new shard's server stood by, then the job took it in.
                m = re.search(r"shard %s of (\d+) serving (\d+) chunks" % rank, said)
                if not m:
                    failures.append("%s, started by the scale-up, never served shard %s (its "
                                    "log: %s)" % (name, rank, runner.logs[name]))
                else:
                    print("%s started by the scale-up: shard %s of %s served %s chunks"
                          % (name, rank, m.group(1), m.group(2)))
        for name in step.remove:
            said = open(runner.logs[name], errors="replace").read()
            m = re.search(r"shard \d+ retired: the job re-sharded to \d+ shards", said)
            if removed[name].startswith("exited") and not m:
                failures.append("%s %s without saying it retired" % (name, removed[name]))
            else:
                print("%s %s%s" % (name, removed[name], " (%s)" % m.group(0) if m else ""))
    for line in re.findall(r"[^\n]*re-sharded from \d+ to \d+ shards[^\n]*", told):
        print("coordinator: " + line.strip())
    if args.evict:
        # The worker leaves after its step, says so, and exits 0; the
        # coordinator takes its rank out of the live set and the job goes on.
        said = open(runner.logs[args.evict], errors="replace").read()
        told = (open(runner.logs[coordinator[0].name], errors="replace").read()
                if len(coordinator) == 1 else "")
        m = re.search(r"worker (\d+) left the job after step (\d+)", told)
        if evicted is None:
            failures.append("--evict %s: no checkpoint was complete while the job trained"
                            % args.evict)
        elif not re.search(r"left the job after \d+ of (\d+|an elastic job's) steps|"
                           r"left the job after step", said):
            failures.append("%s, evicted, did not say it left the job" % args.evict)
        elif not m:
            failures.append("the coordinator did not say the evicted worker left the job")
        else:
            print("%s evicted: worker %s left the job after step %s, and the job went on"
                  % (args.evict, m.group(1), m.group(2)))
    accuracy = None
    if len(coordinator) != 1:
        failures.append("expected one coordinator pod, found %d" % len(coordinator))
    else:
        log = open(runner.logs[coordinator[0].name], errors="replace").read()
        m = re.search(r"job (\S+) completed after .*final test accuracy ([0-9.]+)", log)
        if not m:
            failures.append("the coordinator did not say the job completed with a final accuracy")
        else:
            accuracy = float(m.group(2))
            print("job %s completed: final test accuracy %.4f, wall time %.1f s"
                  % (m.group(1), accuracy, wall))
            if accuracy < args.min_accuracy:
                failures.append("accuracy %.4f < %.2f" % (accuracy, args.min_accuracy))
    # The shards the job ends with: the StatefulSet's replicas after the
    # last step.
    shards = sum(args.final.get(name, o["spec"].get("replicas", 1))
                 for name, o in by_kind.get("StatefulSet", {}).items())
    own_claims = {p.index: {"pvc-" + c for c in p.claims.values()}
                  for p in pods if p.owner[0] == "StatefulSet" and p.claims}
    failures += check_checkpoint_volumes(os.path.join(work, "volumes"), shards, own_claims)

    if failures:
        for name in runner.procs:
            print("---- tail of %s" % name)
            print(runner.tail(name), end="")
        for f in failures:
            print("FAIL: " + f)
        return 1
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin", required=True, help="folder of the grps binaries")
    parser.add_argument("--secrets", required=True, help="deploy/make-secrets' secrets.yaml")
    parser.add_argument("--work", required=True, help="folder for logs and volumes")
    parser.add_argument("--check", action="append", default=[], help="a rendered overlay to check")
    parser.add_argument("--run", help="a rendered overlay to check and run")
    parser.add_argument("--timeout", type=float, default=150)
    parser.add_argument("--min_accuracy", type=float, default=0.7)
    parser.add_argument("--restart", help="kill this pod once a checkpoint is complete and "
                        "start it again (as its StatefulSet would); it must restore from "
                        "the checkpoint on its own claim")
    parser.add_argument("--evict", help="send this pod SIGTERM once a checkpoint newer "
                        "than the last step's is complete, as an eviction or a scale-down "
                        "of its Job does; a worker must leave the job after its step and "
                        "exit 0, and the job complete without it")
    parser.add_argument("--scale", action=StepAction, dest="scale", metavar="NAME=N",
                        help="a step (see the steps above, in order with --exec): the "
                        "Job or StatefulSet NAME scaled to N, as `kubectl scale` of a "
                        "StatefulSet or a patch of an elastic indexed Job's completions "
                        "and parallelism does: the new indexes' pods start (a Job's must "
                        "join the running job); a StatefulSet's past N are taken out "
                        "(SIGTERM to those still running)")
    parser.add_argument("--exec", action=StepAction, dest="exec", metavar="'POD -- COMMAND'",
                        help="a step: COMMAND run in POD's container (a pod's name or "
                        "deployment/NAME) as `kubectl exec` does; it must exit 0")
    parser.add_argument("--examples", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "examples"),
        help="the repository's examples/ (the torch image's %s)" % IMAGE_EXAMPLES)
    parser.add_argument("--image", help="run the pods in this image with podman "
                        "(deploy/build-image) instead of as local processes")
    parser.set_defaults(steps=[])
    args = parser.parse_args()
    if args.image:
        global PODMAN, IMAGE
        IMAGE = args.image
        # runc where crun refuses cgroup v1, and the limits a container may
        # have here: deploy/podman, as deploy/build-image runs it.
        PODMAN = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "deploy",
                               "podman")]
        if os.geteuid() != 0:
            print("FAIL: --image needs root (rootful podman, volumes owned as fsGroup)")
            return 1
    args.bin = os.path.abspath(args.bin)
    args.examples = os.path.abspath(args.examples)
    args.python_dir = os.path.normpath(os.path.join(args.bin, "..", "python"))
    args.work = os.path.abspath(args.work)
    secrets = load(args.secrets)
    problems = []
    try:
        for path in args.check + ([args.run] if args.run else []):
            _, runs, found = check_manifest(path, secrets, args.bin, args.examples)
            problems += found
            print("%s: %d containers: %s" % (
                os.path.basename(path), len(runs),
                "every GRPS_* variable and --flag names a flag of its binary (a Python "
                "worker's: one it reads)" if not found else "%d problems" % len(found)))
        for p in problems:
            print("FAIL: " + p)
        if problems:
            return 1
        if not args.run:
            return 0
        args.held, args.final = plan_steps(load(args.run), args.steps)
        objects, runs, _ = check_manifest(args.run, secrets, args.bin, args.examples,
                                          args.steps)
        return run(args, objects, runs)
    except ManifestError as e:
        print("FAIL: %s" % e)
        return 1


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main())
