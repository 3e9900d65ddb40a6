# IDEM_SANITIZE=ON builds everything with AddressSanitizer and
# UndefinedBehaviorSanitizer; any report aborts the test that caused it.
# IDEM_TSAN=ON builds with ThreadSanitizer instead (the two cannot be
# combined): `make tsan` runs the engine's tests with it.
option(IDEM_SANITIZE "Build with AddressSanitizer and UndefinedBehaviorSanitizer" OFF)
option(IDEM_TSAN "Build with ThreadSanitizer" OFF)
if(IDEM_SANITIZE AND IDEM_TSAN)
  message(FATAL_ERROR "IDEM_SANITIZE and IDEM_TSAN cannot be combined")
endif()
if(IDEM_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer
    -fno-sanitize-recover=all)
  add_link_options(-fsanitize=address,undefined)
endif()
if(IDEM_TSAN)
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer)
  add_link_options(-fsanitize=thread)
endif()
