# Warnings every target of idem is built with; the build stays clean of them.
function(idem_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wshadow
    -Wstrict-prototypes -Wmissing-prototypes -Wno-unused-parameter)
endfunction()
