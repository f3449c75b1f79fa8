"""Macros shared by the grps BUILD files (offline, system libraries)."""

# System tools (Debian: protobuf-compiler, protobuf-compiler-grpc).
PROTOC = "/usr/bin/protoc"
GRPC_CPP_PLUGIN = "/usr/bin/grpc_cpp_plugin"

# CUDA (optional, --config=cuda): nvcc and the libraries the plugin links.
NVCC = "/usr/local/cuda/bin/nvcc"
CUDA_LIB64 = "/usr/local/cuda/lib64"
CUDA_GENCODE = ["-gencode", "arch=compute_90,code=sm_90"]

# Targets that need CUDA: skipped (not an error) unless --config=cuda.
CUDA_ONLY = select({
    "//bazel:cuda_enabled": [],
    "//conditions:default": ["//bazel:incompatible"],
})

def grps_cc_proto(name, src, visibility = None):
    """Messages and gRPC stubs of one .proto, as CMake's proto/ builds them.

    Runs protoc with --proto_path=<the .proto's folder>, so generated code
    includes "grps.pb.h" and users include "proto/grps.pb.h".

    Args:
      name: the cc_library's name.
      src: the .proto file (in this package).
      visibility: of the cc_library.
    """
    base = src[:-len(".proto")]
    outs = [
        base + ".pb.h",
        base + ".pb.cc",
        base + ".grpc.pb.h",
        base + ".grpc.pb.cc",
    ]
    native.genrule(
        name = name + "_gen",
        srcs = [src],
        outs = outs,
        cmd = " ".join([
            PROTOC,
            "--proto_path=$$(dirname $(location %s))" % src,
            "--proto_path=/usr/include",
            "--cpp_out=$(@D)",
            "--grpc_out=$(@D)",
            "--plugin=protoc-gen-grpc=" + GRPC_CPP_PLUGIN,
            "$(location %s)" % src,
        ]),
        message = "protoc " + src,
    )
    native.cc_library(
        name = name,
        srcs = [base + ".pb.cc", base + ".grpc.pb.cc"],
        hdrs = [base + ".pb.h", base + ".grpc.pb.h"],
        # Generated code includes "<base>.pb.h" from its own folder.
        includes = ["."],
        copts = ["-Wno-unused-parameter"],
        deps = [
            "//bazel:grpc",
            "//bazel:protobuf",
        ],
        visibility = visibility,
    )

def grps_cc_test(
        name,
        srcs,
        deps = [],
        size = "medium",
        tags = [],
        gmock = True,
        **kwargs):
    """A GoogleTest binary, like CMake's grps_test().

    CMake's default TIMEOUT 300 is Bazel's size "medium" (300 s).

    Args:
      name: test name (same as the CMake target).
      srcs: test sources.
      deps: libraries under test.
      size: Bazel test size.
      tags: Bazel tags (CMake LABELS).
      gmock: also link GoogleMock (matchers such as IsEmpty, ElementsAre);
        on by default since it costs nothing (static archive).
      **kwargs: passed to cc_test (data, args, env, timeout, ...).

    The test's own sources are compiled unoptimized (-O0), as in CMake: the
    libraries under test keep --compilation_mode=opt, and a test file
    compiles in about half the time.
    """
    native.cc_test(
        name = name,
        srcs = srcs,
        deps = deps + [
            d
            for d in ["//bazel:gtest_main"] + (["//bazel:gmock"] if gmock else [])
            if d not in deps
        ],
        size = size,
        tags = tags,
        # opt's -D_FORTIFY_SOURCE=1 warns without optimization.
        copts = kwargs.pop("copts", []) + ["-O0", "-U_FORTIFY_SOURCE"],
        **kwargs
    )
