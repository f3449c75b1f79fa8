#!/usr/bin/python3
"""Checks the Dockerfile without building it (no Docker engine is needed).

  * the build context (.dockerignore, an allow-list) holds every path the
    CMake build reads: the top-level CMakeLists.txt, cmake/, and every folder
    of its foreach(dir ...) list; and every path it allows exists;
  * the Dockerfile builds CMake targets that exist (add_executable, and
    add_library for the CUDA plugin, pybind11_add_module for the Python
    extension);
  * every program the rendered manifests run (a container's command, an exec
    probe's) is one the image installs in /usr/local/bin, or, in a container
    of the torch image (tag "torch", GRPS_TORCH=ON), /usr/bin/python3 running
    a script the image has: one of the repository's examples/, which it
    installs in /opt/grps/examples;
  * the torch image has what such a worker needs: the extension built, the
    interpreter, PyTorch and numpy installed in the runtime stage, pybind11
    and Python's headers in the build stage, the examples copied;
  * its stages: build-source (compiles the programs), build-prebuilt (takes
    them from prebuilt/ in the build context: deploy/build-image
    --from-build), build (the one GRPS_FROM names, its default in the FROM
    line: podman 4.3 ignores an ARG's default when it picks the stages to
    run) and the runtime stage, which copies from build alone; both build
    stages fill every /out folder the runtime stage copies, and
    deploy/build-image fills prebuilt/ as build-source fills /out (the same
    programs; the Python package and examples/ at the same places);
  * every Debian package it installs is known to apt (apt-cache show), but
    the CUDA ones, which come from NVIDIA's repository.

Prints one line per problem and exits 1, or one OK line. Usage:
  deploy/check_image.py REPO_ROOT RENDERED.yaml...
"""

import os
import re
import subprocess
import sys

import yaml

INSTALL_DIR = "/usr/local/bin/"
# The torch image (GRPS_TORCH=ON; deploy/build-image --torch tags it so,
# overlays/torch names it): its Python workers' interpreter, where it has
# the repository's examples/, and the Debian packages each stage needs.
TORCH_TAG = "torch"
PYTHON = "/usr/bin/python3"
EXAMPLES_DIR = "/opt/grps/examples/"
TORCH_BUILD_PACKAGES = ("pybind11-dev", "python3-dev")
TORCH_RUNTIME_PACKAGES = ("python3", "python3-numpy", "python3-torch")
TORCH_GUARD = '"$GRPS_TORCH" = ON'
# The stages (FROM ... AS name): GRPS_FROM=source or prebuilt picks the
# build stage the runtime stage copies from.
SOURCE_STAGE, PREBUILT_STAGE, BUILD_STAGE = "build-source", "build-prebuilt", "build"
BUILD_BASE = "build-${GRPS_FROM:-source}"
PREBUILT_COPY = "COPY prebuilt/ /out/"


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def instructions(dockerfile):
    """The Dockerfile's instructions, continuation lines joined, comments out."""
    lines, current = [], ""
    for line in dockerfile.splitlines():
        if not current and line.lstrip().startswith("#"):
            continue
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        current += line
        if current.strip():
            lines.append(current.strip())
        current = ""
    return lines


def cmake_targets(root):
    executables, libraries = set(), set()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        rel = os.path.relpath(dirpath, root)
        top = rel.split(os.sep, 1)[0]
        if top.startswith(("build", "bazel-", ".")) and rel != ".":
            dirnames[:] = []
            continue
        if "CMakeLists.txt" in filenames:
            text = read(os.path.join(dirpath, "CMakeLists.txt"))
            executables |= set(re.findall(r"add_executable\(\s*([\w.-]+)", text))
            libraries |= set(re.findall(r"(?:add_library|pybind11_add_module)\(\s*([\w.-]+)",
                                        text))
    return executables, libraries


def stages(steps):
    """Each stage (FROM to FROM) as (name, base, instructions); the name is
    its AS, "" without one."""
    out = []
    for s in steps:
        m = re.match(r"FROM\s+(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?\s*$", s, re.I)
        if m:
            out.append((m.group(2) or "", m.group(1), []))
        elif out:
            out[-1][2].append(s)
    return out


def stage_named(parts, name):
    """The instructions of the stage called `name`, None without one."""
    for n, _, steps_of in parts:
        if n == name:
            return steps_of
    return None


def out_folders(text, prefix):
    """The folders right under `prefix` (/out/, prebuilt/) that a `mkdir -p`
    names themselves (one that makes prefix/opt/grps only with GRPS_TORCH=ON
    does not count for prefix/opt)."""
    found = set()
    for m in re.finditer(r"mkdir -p ([^&;\n]*)", text):
        found |= set(re.findall(re.escape(prefix) + r"(\w+)(?=[\"'\s]|$)", m.group(1)))
    return found


def build_stage_problems(steps, build_image, installed):
    """The stage graph: two build stages, the build stage GRPS_FROM picks,
    and one /out layout from either (and from deploy/build-image's
    prebuilt/)."""
    problems = []
    parts = stages(steps)
    names = [n for n, _, _ in parts]
    for name in (SOURCE_STAGE, PREBUILT_STAGE, BUILD_STAGE):
        if name not in names:
            problems.append("no stage %s (FROM ... AS %s)" % (name, name))
    if problems:
        return problems
    if names.index(BUILD_STAGE) < max(names.index(SOURCE_STAGE), names.index(PREBUILT_STAGE)):
        problems.append("stage %s comes before the stages it picks from" % BUILD_STAGE)
    if names.index(BUILD_STAGE) >= len(parts) - 1:
        problems.append("stage %s is the last: the runtime stage must be" % BUILD_STAGE)
    # ARGs used in FROM lines must come before the first FROM; the default
    # lives in BUILD_BASE because buildah before 1.29 does not apply an
    # ARG's default when it works out which stages are needed.
    first_from = next(i for i, s in enumerate(steps) if s.startswith("FROM "))
    if "ARG GRPS_FROM" not in steps[:first_from]:
        problems.append("no `ARG GRPS_FROM` (without a default) before the first FROM")
    base = dict((n, b) for n, b, _ in parts)
    if base[BUILD_STAGE] != BUILD_BASE or stage_named(parts, BUILD_STAGE):
        problems.append("stage %s is not `FROM %s AS %s` alone"
                        % (BUILD_STAGE, BUILD_BASE, BUILD_STAGE))
    if base[PREBUILT_STAGE] != "scratch" or stage_named(parts, PREBUILT_STAGE) != [PREBUILT_COPY]:
        problems.append("stage %s is not `FROM scratch` and `%s` alone"
                        % (PREBUILT_STAGE, PREBUILT_COPY))
    # The runtime stage copies from `build` only: a COPY from build-source
    # would compile even with GRPS_FROM=prebuilt.
    runtime = parts[-1][2]
    sources = set(re.findall(r"COPY\s+--from=(\S+)", " ".join(runtime)))
    if sources - {BUILD_STAGE}:
        problems.append("the runtime stage copies from %s, not from %s alone"
                        % (", ".join(sorted(sources - {BUILD_STAGE})), BUILD_STAGE))
    needed = set(re.findall(r"COPY\s+--from=%s\s+/out/(\w+)/" % BUILD_STAGE,
                            " ".join(runtime)))
    if not needed:
        problems.append("the runtime stage copies no /out/ folder from %s" % BUILD_STAGE)
    # COPY --from fails on a folder that is not there: each build stage
    # makes all of them, even empty.
    made = out_folders(" ".join(stage_named(parts, SOURCE_STAGE)), "/out/")
    for d in sorted(needed - made):
        problems.append("stage %s does not make /out/%s (mkdir -p), which the runtime "
                        "stage copies" % (SOURCE_STAGE, d))
    if build_image is None:
        return problems + ["no deploy/build-image, which fills %s's prebuilt/" % PREBUILT_STAGE]
    for d in sorted(needed - out_folders(build_image, "prebuilt/")):
        problems.append("deploy/build-image does not make prebuilt/%s (mkdir -p), which "
                        "the runtime stage copies as /out/%s" % (d, d))
    if "--build-arg GRPS_FROM=prebuilt" not in build_image:
        problems.append("deploy/build-image --from-build does not pass "
                        "--build-arg GRPS_FROM=prebuilt")
    m = re.search(r"^programs=\(([^)]*)\)", build_image, re.M)
    programs = set(m.group(1).split()) if m else set()
    if programs != installed:
        problems.append("deploy/build-image's programs=(%s) are not the ones %s installs (%s)"
                        % (" ".join(sorted(programs)), SOURCE_STAGE, " ".join(sorted(installed))))
    if not re.search(r'strip --strip-unneeded -o "\$context/prebuilt/bin/\$b"', build_image):
        problems.append("deploy/build-image does not put the programs in prebuilt/bin/")
    # The Python package and examples/ where build-source puts them (the
    # runtime stage imports the one and the manifests run the other).
    if not re.search(r"site=\$context/prebuilt/lib/python\$version/dist-packages\b",
                     build_image) or not re.search(r'cp -r "\$pydir" "\$site/"', build_image):
        problems.append("deploy/build-image does not put the Python package in "
                        "prebuilt/lib/pythonX.Y/dist-packages/ (build-source's place)")
    if not re.search(r'cp -r examples "\$context/prebuilt/opt/grps/"', build_image):
        problems.append("deploy/build-image does not copy examples/ to prebuilt/opt/grps/ "
                        "(the runtime stage's %s)" % EXAMPLES_DIR)
    return problems


def installs(steps, guard=None):
    """The Debian packages the steps install (only those of steps that
    test `guard`, when given)."""
    packages = []
    for s in steps:
        if guard is not None and guard not in s:
            continue
        for m in re.finditer(r"apt-get install ([^&]*)", s):
            packages += [p for p in m.group(1).split() if not p.startswith("-") and "$" not in p]
    return packages


def torch_image_problems(steps, dockerfile, allowed, built):
    """What the torch image (GRPS_TORCH=ON) lacks for a Python worker."""
    problems = []
    parts = stages(steps)
    source = stage_named(parts, SOURCE_STAGE)
    if source is None or len(parts) < 2:
        return ["no stage %s and runtime stage after it to check the torch image in"
                % SOURCE_STAGE]
    for stage, steps_of, needed in ((SOURCE_STAGE, source, TORCH_BUILD_PACKAGES),
                                    ("runtime", parts[-1][2], TORCH_RUNTIME_PACKAGES)):
        packages = installs(steps_of, TORCH_GUARD)
        for p in needed:
            if p not in packages:
                problems.append("the %s stage does not install %s when %s"
                                % (stage, p, TORCH_GUARD))
    if "_grps" not in built:
        problems.append("GRPS_TORCH=ON does not build the extension _grps")
    build_run = " ".join(source)
    if not re.search(r"-DGRPS_PYTHON=\$GRPS_TORCH\b", build_run):
        problems.append("the CMake build does not get -DGRPS_PYTHON=$GRPS_TORCH")
    if not re.search(r"site=/out/lib/.*?/dist-packages .*cp -r build/python/grps \$site/",
                     build_run):
        problems.append("the build stage does not copy the package build/python/grps "
                        "under /out/lib/ (the runtime stage's /usr/local/lib/)")
    if not re.search(r"cp -r examples /out/opt/grps/", build_run):
        problems.append("the build stage does not copy examples/ to /out/opt/grps/ "
                        "(the runtime stage's %s)" % EXAMPLES_DIR)
    if not re.search(r"COPY --from=build /out/opt/ /opt/", dockerfile):
        problems.append("the runtime stage does not COPY /out/opt/ to /opt/")
    if "examples" not in allowed:
        problems.append(".dockerignore leaves out examples, which the torch image installs")
    return problems


def image_tag(image):
    """The tag of an image reference (registry/name:tag), "" without one."""
    last = image.split("@")[0].rsplit("/", 1)[-1]
    return last.split(":", 1)[1] if ":" in last else ""


def python_problems(where, image, argv, root):
    """A container that runs the Python interpreter: the torch image's, and a
    script that image has."""
    problems = []
    if image_tag(image) != TORCH_TAG:
        problems.append("%s: runs %s in image %s, which has no Python package (the torch "
                        "image: tag %s, GRPS_TORCH=ON)" % (where, PYTHON, image, TORCH_TAG))
    scripts = [a for a in argv[1:] if not a.startswith("-")]
    if not scripts:
        problems.append("%s: %s runs no script" % (where, PYTHON))
    elif not scripts[0].startswith(EXAMPLES_DIR):
        problems.append("%s: script %s is not one the image installs (%s...: the "
                        "repository's examples/)" % (where, scripts[0], EXAMPLES_DIR))
    elif not os.path.isfile(os.path.join(root, "examples", scripts[0][len(EXAMPLES_DIR):])):
        problems.append("%s: script %s: examples/%s is not in the repository"
                        % (where, scripts[0], scripts[0][len(EXAMPLES_DIR):]))
    return problems


def commands(rendered):
    """(where, argv, image) of every container command (with its args) and
    exec probe."""
    found = []
    for path in rendered:
        with open(path, encoding="utf-8") as f:
            for obj in yaml.safe_load_all(f):
                if not obj:
                    continue
                spec = obj.get("spec", {})
                pod = spec.get("template", {}).get("spec", {}) if "template" in spec else spec
                for c in pod.get("containers", []) + pod.get("initContainers", []):
                    where = "%s: %s %s container %s" % (
                        os.path.basename(path), obj["kind"], obj["metadata"]["name"], c["name"])
                    found.append((where + " command",
                                  (c.get("command") or [None]) + (c.get("args") or []),
                                  c.get("image", "")))
                    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                        if "exec" in c.get(probe, {}):
                            found.append(("%s %s" % (where, probe), c[probe]["exec"]["command"],
                                          c.get("image", "")))
    return found


def main():
    if len(sys.argv) < 3:
        print(__doc__.strip().splitlines()[-1])
        return 2
    root, rendered = sys.argv[1], sys.argv[2:]
    problems = []
    dockerfile = read(os.path.join(root, "Dockerfile"))
    steps = instructions(dockerfile)

    # The build context.
    allowed = [l[1:].strip() for l in read(os.path.join(root, ".dockerignore")).splitlines()
               if l.startswith("!")]
    for path in allowed:
        if not os.path.exists(os.path.join(root, path)):
            problems.append(".dockerignore lets in %s, which does not exist" % path)
    top = read(os.path.join(root, "CMakeLists.txt"))
    needed = ["CMakeLists.txt", "cmake"]
    for group in re.findall(r"foreach\(\s*dir\s+([^)]*)\)", top):
        needed += group.split()
    needed += re.findall(r"add_subdirectory\(\s*([\w./-]+)", top)
    for path in needed:
        if path not in allowed:
            problems.append(".dockerignore leaves out %s, which the CMake build reads" % path)
    if not any(re.match(r"COPY\s+\.\s+\.$", s) for s in steps):
        problems.append("the build stage does not COPY . . (the context .dockerignore allows)")

    # The targets it builds and the programs it installs.
    executables, libraries = cmake_targets(root)
    built = []
    for s in steps:
        for m in re.finditer(r'targets="([^"$]*)', s):
            built += m.group(1).split()
        for m in re.finditer(r'targets="\$targets ([^"]*)"', s):
            built += m.group(1).split()
    if not built:
        problems.append("found no targets=\"...\" list of CMake targets in the Dockerfile")
    for t in built:
        if t not in executables and t not in libraries:
            problems.append("the Dockerfile builds %s, which no CMakeLists.txt defines" % t)
    installed = set()
    for s in steps:
        for m in re.finditer(r"for b in ([\w\s.-]+?); do", s):
            installed |= set(m.group(1).split())
    if not re.search(r"COPY --from=build /out/bin/ %s" % re.escape(INSTALL_DIR), dockerfile):
        problems.append("the runtime stage does not COPY /out/bin/ to %s" % INSTALL_DIR)
    for b in installed:
        if b not in built:
            problems.append("the Dockerfile installs %s but does not build it" % b)
    for where, argv, image in commands(rendered):
        program = argv[0]
        if program is None:
            problems.append("%s: none (the image has no ENTRYPOINT to fall back on)" % where)
        elif program == PYTHON:
            problems += python_problems(where, image, argv, root)
        elif not program.startswith(INSTALL_DIR) or program[len(INSTALL_DIR):] not in installed:
            problems.append("%s: %s is not a program the image installs (%s)"
                            % (where, program, ", ".join(INSTALL_DIR + b for b in sorted(installed))))

    build_image_path = os.path.join(root, "deploy", "build-image")
    build_image = read(build_image_path) if os.path.isfile(build_image_path) else None
    problems += build_stage_problems(steps, build_image, installed)
    problems += torch_image_problems(steps, dockerfile, allowed, built)

    # Debian packages (not the CUDA ones: NVIDIA's repository, named with $CUDA).
    packages = installs([s for s in steps if not ("GRPS_CUDA" in s and "cuda-keyring" in s)])
    if not packages:
        problems.append("found no apt-get install in the Dockerfile")
    if packages:
        shown = subprocess.run(["apt-cache", "show", "--no-all-versions"] + packages,
                               capture_output=True, text=True).stdout
        found = set(re.findall(r"^Package: (\S+)", shown, re.M))
        for p in packages:
            if p not in found:
                problems.append("Debian package %s: unknown to apt-cache (misspelled? "
                                "run apt-get update)" % p)

    for p in problems:
        print("check_image: " + p)
    if problems:
        return 1
    python = [argv for _, argv, _ in commands(rendered) if argv[0] == PYTHON]
    print("check_image: OK: the build context has all %d paths the CMake build reads; "
          "it builds %s (stage %s; %s takes them from deploy/build-image --from-build); "
          "the manifests run only what it installs (%d commands and probes, "
          "%d of them %s with the torch image's examples); %d Debian packages known"
          % (len(needed), " ".join(built), SOURCE_STAGE, PREBUILT_STAGE,
             len(commands(rendered)), len(python), PYTHON, len(packages)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
