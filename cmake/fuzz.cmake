# Sanitizer and fuzzing builds (docs/reliability.md).
#
# SHOAL_SANITIZE: the -fsanitize= list for every target, e.g. "address,undefined"
# or "thread". Reports are never recovered from, so any report fails the test
# that triggered it (TSan also needs TSAN_OPTIONS=halt_on_error=1: it has no
# recover switch of its own; scripts/test_sanitizers.sh sets it).
#
# SHOAL_FUZZ=ON (clang only): the library is also instrumented for libFuzzer
# (-fsanitize=fuzzer-no-link; tests/CMakeLists.txt takes it off the test
# programs, which are never fuzzed) and tests/fuzz builds one libFuzzer program per
# tests/fuzz/fuzz_<name>.cc, registered with ctest under the label "fuzz"
# (SHOAL_FUZZ_SECONDS each; scripts/test_fuzz.sh runs them).
option(SHOAL_FUZZ "Build the libFuzzer targets of tests/fuzz (needs clang)" OFF)
set(SHOAL_FUZZ_SECONDS 40 CACHE STRING "How long ctest runs each fuzz target, in seconds")

if(SHOAL_SANITIZE)
  string(REPLACE " " "" SHOAL_SANITIZE_LIST "${SHOAL_SANITIZE}")
  add_compile_options(-fsanitize=${SHOAL_SANITIZE_LIST} -fno-omit-frame-pointer -fno-sanitize-recover=all)
  add_link_options(-fsanitize=${SHOAL_SANITIZE_LIST})
  if(SHOAL_SANITIZE_LIST MATCHES "undefined")
    # The one check left out: the C API's enums (dtype, op, status, memory
    # kind) are ints to a C caller, and any int is a legal value there; shoal
    # checks each and refuses a bad one (tests/collectives/test_errors.cc passes
    # them on purpose). In C++ loading such a value is what -fsanitize=enum
    # reports, so it would flag the very checks that refuse it.
    add_compile_options(-fno-sanitize=enum)
  endif()
endif()

if(SHOAL_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "SHOAL_FUZZ=ON needs clang (libFuzzer): configure with -DCMAKE_C_COMPILER=clang "
                        "-DCMAKE_CXX_COMPILER=clang++ (Debian packages clang and libclang-rt-dev)")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link)
endif()
