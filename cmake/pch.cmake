# Precompiled headers (GRPS_PCH, on by default): the system and generated
# headers that most of the tree's sources include (the standard library,
# Abseil, spdlog, gRPC, proto/grps.grpc.pb.h; GoogleTest for the tests) are
# parsed once per build instead of once per source: proto/grps.grpc.pb.h
# alone takes clang 2.9 s to parse. A precompiled header serves only sources
# compiled with the flags it was made with, so there are three, each made
# once in an object library of its own and reused (REUSE_FROM) by every
# target of its kind:
#
#   grps_pch_lib    the libraries' sources (-fPIC, the build's optimization)
#   grps_pch_exe    the programs' own sources (-fPIE)
#   grps_pch_test   the tests' own sources (-fPIE, -O0: see grps_test)
#
# Every flag the build adds for all targets (the sanitizers', the fuzzers'
# coverage) applies to them alike. A source that must not see these headers
# first, or a target with flags of its own, is left out: the Python
# extension (LTO, hidden visibility), the CUDA plugin, the TSan build's
# Abseil interposer, the generated protobuf code (the headers are made from
# it), and any source with SKIP_PRECOMPILE_HEADERS.
# include() this after find_package(spdlog) (its definitions, below) and
# cmake/sanitizers.cmake (_grps_targets_below); call
# grps_precompile_targets() after the subdirectories.

option(GRPS_PCH "Precompile the headers most sources include (cmake/pch.cmake)" ON)
# POSIX threads are a flag a precompiled header must share: every C++ source
# compiles with -pthread (most had it from gRPC's or Abseil's targets).
# So are the macros that change what spdlog's and fmt's headers declare:
# every source compiles with spdlog's and fmt's definitions (else gcc
# passes the precompiled header by and reads the headers as text, in
# spdlog's header-only mode).
if(GRPS_PCH)
  add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-pthread>)
  foreach(lib spdlog::spdlog fmt::fmt)
    get_target_property(defs ${lib} INTERFACE_COMPILE_DEFINITIONS)
    if(defs)
      add_compile_definitions(${defs})
    endif()
  endforeach()
endif()

set(_grps_pch_headers
    <algorithm> <atomic> <cmath> <cstdint> <cstring> <functional> <map> <memory>
    <optional> <string> <thread> <utility> <vector>
    <absl/status/status.h> <absl/status/statusor.h> <absl/strings/str_cat.h>
    <absl/strings/string_view.h> <absl/synchronization/mutex.h> <absl/time/clock.h>
    <absl/time/time.h> <absl/types/span.h> <spdlog/spdlog.h> <grpcpp/grpcpp.h>
    <proto/grps.pb.h> <proto/grps.grpc.pb.h>)

# Targets never given a precompiled header (see the top).
set(_grps_pch_skip _grps grps_cuda grps_tsan_absl_sync grps_proto grps_lookup_proto)

# _grps_pch_host(NAME PIC|PIE [TEST]): the object library that makes one of
# the precompiled headers.
function(_grps_pch_host name kind)
  add_library(${name} OBJECT ${_grps_pch_source})
  target_link_libraries(${name} PRIVATE grps_proto spdlog::spdlog absl::status absl::statusor
                        absl::strings absl::synchronization absl::time absl::span)
  if(kind STREQUAL "PIE")
    set_target_properties(${name} PROPERTIES POSITION_INDEPENDENT_CODE OFF)
    target_compile_options(${name} PRIVATE -fPIE)
  endif()
  set(headers ${_grps_pch_headers})
  if(ARGN STREQUAL "TEST")
    target_link_libraries(${name} PRIVATE GTest::gtest GTest::gmock)
    target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-O0>)
    list(APPEND headers <gtest/gtest.h> <gmock/gmock.h>)
  endif()
  target_precompile_headers(${name} PRIVATE ${headers})
endfunction()

# Gives every C++ target of the tree the precompiled header of its kind.
function(grps_precompile_targets)
  if(NOT GRPS_PCH)
    return()
  endif()
  # The hosts' one source, made in the build folder (every source of the
  # tree is listed in both builds; this one is no source of the project).
  set(_grps_pch_source ${CMAKE_BINARY_DIR}/grps_pch.cc)
  file(CONFIGURE OUTPUT ${_grps_pch_source}
       CONTENT "// The headers are all it compiles (cmake/pch.cmake).\n")
  _grps_pch_host(grps_pch_lib PIC)
  _grps_pch_host(grps_pch_exe PIE)
  _grps_pch_host(grps_pch_test PIE TEST)
  _grps_targets_below(${CMAKE_SOURCE_DIR} targets)
  foreach(t IN LISTS targets)
    if(t IN_LIST _grps_pch_skip OR t MATCHES "^grps_pch_")
      continue()
    endif()
    get_target_property(type ${t} TYPE)
    get_target_property(sources ${t} SOURCES)
    list(FILTER sources INCLUDE REGEX "\\.cc$")
    if(NOT sources OR NOT type MATCHES "^(EXECUTABLE|STATIC_LIBRARY|OBJECT_LIBRARY)$")
      continue()
    endif()
    get_target_property(test ${t} GRPS_TEST)
    if(test)
      target_precompile_headers(${t} REUSE_FROM grps_pch_test)
    elseif(type STREQUAL "EXECUTABLE")
      target_precompile_headers(${t} REUSE_FROM grps_pch_exe)
    else()
      target_precompile_headers(${t} REUSE_FROM grps_pch_lib)
    endif()
  endforeach()
endfunction()
