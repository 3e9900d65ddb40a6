# IDEM_FUZZ=ON (with CMAKE_C_COMPILER=clang) builds everything with
# libFuzzer's coverage instrumentation, AddressSanitizer and
# UndefinedBehaviorSanitizer, and builds the fuzz drivers of tests/fuzz as
# libFuzzer programs. `make fuzz` (scripts/fuzz.sh) configures such a build
# in a folder of its own; the normal builds only replay the drivers' corpora.
option(IDEM_FUZZ "Build the libFuzzer drivers (clang)" OFF)
if(IDEM_FUZZ)
  if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "IDEM_FUZZ needs clang: configure with "
      "-DCMAKE_C_COMPILER=clang")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link,address,undefined
    -fno-omit-frame-pointer -fno-sanitize-recover=all)
  add_link_options(-fsanitize=address,undefined)
endif()
