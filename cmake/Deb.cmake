# `make deb`: one Debian package, idem_VERSION_ARCH.deb, with the program,
# libidem (shared and static), idem.h, idem.pc, the manual pages, the
# completions and the systemd unit. Configured with -DIDEM_DEB=ON and
# CMAKE_INSTALL_PREFIX=/usr (the Makefile does both); then the build adds
# what Debian's policy wants of a package's files: compressed manual pages
# and changelog, and a copyright file. CPack's shlibdeps (dpkg-shlibdeps)
# computes Depends from the binaries.
set(CPACK_PACKAGE_CONTACT
  "Seed fe53aad3 maintainers <maintainers@users.noreply.a-seed-fe53aad3.example>")

if(IDEM_DEB)
  # Manual pages and the changelog, compressed as Debian wants them
  # (gzip -9n: no name or time stamp in the file, so builds are the same).
  set(IDEM_GZ_FILES)
  foreach(page ${IDEM_MAN1} ${CMAKE_CURRENT_SOURCE_DIR}/man/libidem.3)
    get_filename_component(name ${page} NAME)
    add_custom_command(OUTPUT ${CMAKE_CURRENT_BINARY_DIR}/man/${name}.gz
      COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_CURRENT_BINARY_DIR}/man
      COMMAND gzip -9nc ${page} > ${CMAKE_CURRENT_BINARY_DIR}/man/${name}.gz
      DEPENDS ${page} VERBATIM)
    list(APPEND IDEM_GZ_FILES ${CMAKE_CURRENT_BINARY_DIR}/man/${name}.gz)
  endforeach()
  # A native package's changelog: Debian's format, one entry per version.
  string(TIMESTAMP IDEM_DEB_DATE "%a, %d %b %Y %H:%M:%S +0000" UTC)
  configure_file(${CMAKE_CURRENT_SOURCE_DIR}/packaging/changelog.in
    ${CMAKE_CURRENT_BINARY_DIR}/changelog @ONLY)
  add_custom_command(OUTPUT ${CMAKE_CURRENT_BINARY_DIR}/changelog.gz
    COMMAND gzip -9nc ${CMAKE_CURRENT_BINARY_DIR}/changelog
      > ${CMAKE_CURRENT_BINARY_DIR}/changelog.gz
    DEPENDS ${CMAKE_CURRENT_BINARY_DIR}/changelog VERBATIM)
  list(APPEND IDEM_GZ_FILES ${CMAKE_CURRENT_BINARY_DIR}/changelog.gz)
  add_custom_target(idem_deb_files ALL DEPENDS ${IDEM_GZ_FILES})

  foreach(gz ${IDEM_GZ_FILES})
    get_filename_component(name ${gz} NAME)
    if(name MATCHES "\\.1\\.gz$")
      install(FILES ${gz} DESTINATION ${CMAKE_INSTALL_MANDIR}/man1 COMPONENT program)
    elseif(name MATCHES "\\.3\\.gz$")
      install(FILES ${gz} DESTINATION ${CMAKE_INSTALL_MANDIR}/man3 COMPONENT program)
    else()
      install(FILES ${gz} DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT program)
    endif()
  endforeach()
  install(FILES packaging/copyright DESTINATION ${CMAKE_INSTALL_DOCDIR}
    COMPONENT program)
endif()

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME idem)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_VENDOR "idem")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "${PROJECT_DESCRIPTION}")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION net)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# The shlibs file for libidem.so.0.3; the library cache is refreshed by
# dpkg's ldconfig trigger, not by ldconfig in maintainer scripts (which
# CPack would write: ours replace them).
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
  ${CMAKE_CURRENT_SOURCE_DIR}/packaging/triggers
  ${CMAKE_CURRENT_SOURCE_DIR}/packaging/postinst
  ${CMAKE_CURRENT_SOURCE_DIR}/packaging/postrm)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "bash-completion, postgresql")
# The long description; CPack puts the summary line
# (CPACK_PACKAGE_DESCRIPTION_SUMMARY) before it and indents each line.
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION "idem makes retries of side-effecting tool calls safe: a caller names one
intention with an operation key, and idem stores the key, a fingerprint
of the request (RFC 8785 canonical JSON) and its response, so that a
retry gets the stored answer instead of acting twice.
.
This package holds the idem program (idem serve, an HTTP gateway giving
any API Idempotency-Key semantics; idem mcp, a proxy for MCP tool calls;
idem run; idem keys), the libidem library with its header and pkg-config
files, manual pages, bash and zsh completion and the systemd unit
idem-serve@.service.")
include(CPack)
