# The grps image that deploy/ runs: grps-coordinator, grps-server,
# grps-worker and grpsctl (the manifests' health probes) in
# /usr/local/bin, on Debian 12 with its runtime libraries only, as an
# unprivileged user (uid 10001).
#
#   docker build -t grps:cpu .                              # deploy/overlays/cpu, dev
#   docker build --build-arg GRPS_CUDA=ON -t grps:gpu .     # deploy/overlays/gpu
#   docker build --build-arg GRPS_TORCH=ON -t grps:torch .  # deploy/overlays/torch
#
# GRPS_CUDA=ON also builds the CUDA backend plugin (libgrps_cuda.so, in
# /usr/local/lib where the worker's dlopen finds it) and installs NVIDIA's
# nvcc and cuBLAS from NVIDIA's CUDA repository for Debian 12 (CUDA is not
# in Debian); the driver's libcuda.so.1 comes from the node at run time
# (NVIDIA's container toolkit).
#
# GRPS_TORCH=ON also builds the grps Python package (python/: the pybind11
# extension _grps and grps/*.py, docs/pytorch.md) for Debian's
# /usr/bin/python3 and installs it where that interpreter finds it
# (/usr/local/lib/python3.X/dist-packages), with Debian's python3-torch (a
# CPU build of PyTorch) and python3-numpy, and the repository's examples/ in
# /opt/grps/examples: the workers of deploy/overlays/torch run
# `python3 SCRIPT`. The default image is as it was without it.
#
# The programs come from the build-source stage by default: it compiles
# them here. GRPS_FROM=prebuilt takes them from a CMake build already made
# instead (the build-prebuilt stage: prebuilt/ in the build context, laid
# out as build-source's /out), so no compiler or -dev package is installed
# and nothing is compiled. The repository is not such a context (it has no
# prebuilt/): deploy/build-image --from-build build/bin makes one, a
# temporary folder with this file and the CMake build's programs (stripped;
# with --cuda the plugin, with --torch the Python package and examples/),
# and CI builds its image so, from the CMake build it tests. The runtime
# stage is the same either way. podman builds only the stages the target
# needs (checked with Debian 12's podman 4.3), so only the build stage
# GRPS_FROM names runs; so does Docker's BuildKit (its default builder),
# but not its legacy builder (DOCKER_BUILDKIT=0), which builds every stage
# and stops at build-prebuilt's COPY (not checked here: no Docker engine).
#
# scripts/check-deploy checks this file statically: the build context
# (.dockerignore) holds every folder the CMake build reads, the targets are
# the CMake executables (and the plugin and the extension), every command
# the manifests run is installed here (a Python worker's interpreter and
# script: in the torch image), and both build stages fill the /out folders
# the runtime stage copies (deploy/build-image's prebuilt/ too).
ARG DEBIAN=debian:bookworm
# source or prebuilt. Its default is in the FROM line that uses it
# (${GRPS_FROM:-source}), not here: buildah before 1.29 (Debian 12's podman
# 4.3) ignores an ARG's default when it works out which stages the target
# needs; with ARG GRPS_FROM=source, a plain `podman build .` skipped
# build-source and then failed (build-source: image not known).
ARG GRPS_FROM

# ---- build-source: the programs compiled here ---------------------------
FROM ${DEBIAN} AS build-source
ARG GRPS_CUDA=OFF
ARG GRPS_TORCH=OFF
# CUDA's version as NVIDIA's package names spell it (cuda-nvcc-13-0).
ARG CUDA=13-0
# scripts/setup's build packages (the tests' and benchmarks' libraries too:
# the CMake configure step looks for them, though only the daemons are built).
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      build-essential cmake ninja-build pkg-config \
      libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler \
      libabsl-dev libopenblas-dev zlib1g-dev libspdlog-dev libfmt-dev libssl-dev \
      libgtest-dev libgmock-dev libbenchmark-dev libboost-dev \
      prometheus-cpp-dev \
 && rm -rf /var/lib/apt/lists/*
RUN if [ "$GRPS_CUDA" = ON ]; then \
      apt-get update \
      && apt-get install -y --no-install-recommends ca-certificates wget \
      && wget -q https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb \
      && dpkg -i cuda-keyring_1.1-1_all.deb && rm cuda-keyring_1.1-1_all.deb \
      && apt-get update \
      && apt-get install -y --no-install-recommends \
           cuda-nvcc-$CUDA cuda-cudart-dev-$CUDA libcublas-dev-$CUDA \
      && rm -rf /var/lib/apt/lists/*; \
    fi
# What python/CMakeLists.txt needs to build the extension (PyTorch and
# numpy are the package's imports at run time, not the build's).
RUN if [ "$GRPS_TORCH" = ON ]; then \
      apt-get update \
      && apt-get install -y --no-install-recommends pybind11-dev python3-dev \
      && rm -rf /var/lib/apt/lists/*; \
    fi
WORKDIR /src
COPY . .
# Only the four programs (and the plugin, and the extension): the tests,
# benchmarks and tools are not in the image. CMake finds nvcc at
# /usr/local/cuda/bin/nvcc. /out mirrors where the runtime stage puts
# things: bin/ and lib/ under /usr/local, opt/ under /opt.
RUN cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGRPS_CUDA=$GRPS_CUDA \
      -DGRPS_PYTHON=$GRPS_TORCH \
 && targets="grps-coordinator grps-server grps-worker grpsctl" \
 && if [ "$GRPS_CUDA" = ON ]; then targets="$targets grps_cuda"; fi \
 && if [ "$GRPS_TORCH" = ON ]; then targets="$targets _grps"; fi \
 && cmake --build build --target $targets \
 && mkdir -p /out/bin /out/lib /out/opt \
 && for b in grps-coordinator grps-server grps-worker grpsctl; do \
      strip --strip-unneeded -o /out/bin/$b build/bin/$b; \
    done \
 && if [ "$GRPS_CUDA" = ON ]; then cp build/bin/libgrps_cuda.so /out/lib/; fi \
 && if [ "$GRPS_TORCH" = ON ]; then \
      site=/out/lib/$(python3 -c 'import sys; print("python%d.%d" % sys.version_info[:2])')/dist-packages \
      && mkdir -p $site /out/opt/grps \
      && cp -r build/python/grps $site/ \
      && strip --strip-unneeded $site/grps/_grps.*.so \
      && cp -r examples /out/opt/grps/; \
    fi

# ---- build-prebuilt: the programs of a CMake build already made ---------
# prebuilt/ holds bin/, lib/ and opt/ as build-source's /out does (empty
# folders where there is nothing: the runtime stage copies all three).
FROM scratch AS build-prebuilt
COPY prebuilt/ /out/

# ---- build: the one GRPS_FROM names -------------------------------------
FROM build-${GRPS_FROM:-source} AS build

# ---- runtime ------------------------------------------------------------
FROM ${DEBIAN}
ARG GRPS_CUDA=OFF
ARG GRPS_TORCH=OFF
ARG CUDA=13-0
# The shared libraries the programs link (ldd), and the Fashion-MNIST data
# of the default job (GRPS_DATASET; mount another data set over it).
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      libgrpc++1.51 libprotobuf32 libabsl20220623 libopenblas0-pthread zlib1g \
      libspdlog1.10 libfmt9 libssl3 libprometheus-cpp-core1.0 \
      dataset-fashion-mnist \
 && rm -rf /var/lib/apt/lists/*
RUN if [ "$GRPS_CUDA" = ON ]; then \
      apt-get update \
      && apt-get install -y --no-install-recommends ca-certificates wget \
      && wget -q https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb \
      && dpkg -i cuda-keyring_1.1-1_all.deb && rm cuda-keyring_1.1-1_all.deb \
      && apt-get update \
      && apt-get install -y --no-install-recommends cuda-cudart-$CUDA libcublas-$CUDA \
      && apt-get purge -y wget && apt-get autoremove -y \
      && rm -rf /var/lib/apt/lists/*; \
    fi
# The Python workers' interpreter (/usr/bin/python3, the manifests'
# command) and the grps package's imports.
RUN if [ "$GRPS_TORCH" = ON ]; then \
      apt-get update \
      && apt-get install -y --no-install-recommends python3 python3-numpy python3-torch \
      && rm -rf /var/lib/apt/lists/*; \
    fi
COPY --from=build /out/bin/ /usr/local/bin/
COPY --from=build /out/lib/ /usr/local/lib/
COPY --from=build /out/opt/ /opt/
# The package imports with the image's PyTorch (and its bytecode is
# compiled now: the pods' root file system is read-only).
RUN if [ "$GRPS_TORCH" = ON ]; then python3 -c 'import grps.torch'; fi
RUN ldconfig \
 && groupadd --system --gid 10001 grps \
 && useradd --system --uid 10001 --gid grps --no-create-home \
      --home-dir /nonexistent --shell /usr/sbin/nologin grps
USER 10001:10001
# deploy/ names the program to run (command:); alone, the image says what
# it holds.
CMD ["/usr/local/bin/grpsctl", "--help"]
