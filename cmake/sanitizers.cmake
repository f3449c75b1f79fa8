# Sanitizer builds and clang's thread-safety analysis; scripts/sanitize drives
# them (asan, tsan, tsa), each in a build folder of its own.
#
#   -DGRPS_SANITIZE=address,undefined   ASan + UBSan (+ LeakSanitizer)
#   -DGRPS_SANITIZE=thread              TSan
#   -DGRPS_THREAD_SAFETY=ON             clang: -Wthread-safety as errors, so the
#                                       compiler checks every ABSL_GUARDED_BY and
#                                       ABSL_EXCLUSIVE_LOCKS_REQUIRED
#
# GRPS_SANITIZE takes -fsanitize='s list and instruments every target, tests
# and daemons alike (the e2e tests run the daemons). A finding aborts the
# process (-fno-sanitize-recover); sanitize/ holds the run-time side: the
# suppressions for uninstrumented system libraries and, for TSan, what
# Debian's uninstrumented Abseil synchronization does (tsan_absl_sync.cc).
# include() this before the subdirectories; call grps_sanitize_targets()
# after them.

set(GRPS_SANITIZE "" CACHE STRING
    "Sanitizers for every target, as -fsanitize= takes them: address,undefined or thread")
option(GRPS_THREAD_SAFETY
       "clang only: -Wthread-safety as errors on the project's own sources" OFF)

set(GRPS_TSAN OFF)
if(GRPS_SANITIZE)
  string(REPLACE "," ";" _grps_sanitizers "${GRPS_SANITIZE}")
  if("thread" IN_LIST _grps_sanitizers)
    set(GRPS_TSAN ON)
    if("address" IN_LIST _grps_sanitizers)
      message(FATAL_ERROR "GRPS_SANITIZE: thread and address cannot be combined")
    endif()
  endif()
  if(GRPS_HAVE_CUDA)
    # nvcc neither takes these flags nor instruments device code.
    message(FATAL_ERROR "GRPS_SANITIZE needs -DGRPS_CUDA=OFF")
  endif()
  # Line tables are all that symbolized stack traces need (-g1, a fraction of
  # -g's size); frame pointers make the traces cheap and whole.
  add_compile_options(-fsanitize=${GRPS_SANITIZE} -fno-sanitize-recover=all
                      -fno-omit-frame-pointer -g1)
  add_link_options(-fsanitize=${GRPS_SANITIZE})
  if(GRPS_TSAN)
    # Each executable defines Abseil's Mutex, CondVar and Notification
    # functions (sanitize/tsan_absl_sync.cc); export them so that they also
    # interpose the calls from inside gRPC and Abseil.
    add_link_options(LINKER:--export-dynamic-symbol=_ZN4absl*
                     LINKER:--export-dynamic-symbol=_ZNK4absl*)
  endif()
  message(STATUS "grps: sanitizers: ${GRPS_SANITIZE}")
endif()

if(GRPS_THREAD_SAFETY)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "GRPS_THREAD_SAFETY needs clang (-DCMAKE_CXX_COMPILER=clang++)")
  endif()
  # -Wthread-safety is analysis, attributes, precise and reference; system
  # headers (Abseil, gRPC) are exempt as for every warning. The generated
  # protobuf code is taken out in grps_sanitize_targets().
  add_compile_options(-Wthread-safety -Werror=thread-safety)
  message(STATUS "grps: thread-safety analysis: -Wthread-safety -Werror=thread-safety")
endif()

# Every target defined in `dir` and below.
function(_grps_targets_below dir out)
  get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(sub IN LISTS subdirs)
    _grps_targets_below(${sub} below)
    list(APPEND targets ${below})
  endforeach()
  set(${out} ${targets} PARENT_SCOPE)
endfunction()

# What needs every target defined: the thread-safety analysis stays off the
# generated protobuf code (grps_proto, grps_lookup_proto), and in a TSan build every executable
# gets sanitize/tsan_absl_sync.cc's objects.
function(grps_sanitize_targets)
  if(GRPS_THREAD_SAFETY)
    foreach(t grps_proto grps_lookup_proto)
      target_compile_options(${t} PRIVATE -Wno-thread-safety)
    endforeach()
  endif()
  if(GRPS_TSAN)
    _grps_targets_below(${CMAKE_SOURCE_DIR} targets)
    foreach(t IN LISTS targets)
      get_target_property(type ${t} TYPE)
      if(type STREQUAL "EXECUTABLE")
        target_link_libraries(${t} PRIVATE grps_tsan_absl_sync)
      endif()
    endforeach()
  endif()
endfunction()
