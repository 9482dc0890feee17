# `cmake --install` / `make install`: the command, the library (static and
# shared), its headers and pkg-config file, and the man pages and shell
# completion that the installed command generates from its option tables.
include(GNUInstallDirs)
# Installed binaries keep the run path of the libraries they link outside
# the default search path (Debian's OpenBLAS), as built.
set_target_properties(plexus plexus_shared PROPERTIES INSTALL_RPATH_USE_LINK_PATH TRUE)
install(TARGETS plexus RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS plexus_static plexus_shared
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY ${CMAKE_SOURCE_DIR}/include/plexus DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
configure_file(${CMAKE_SOURCE_DIR}/cmake/plexus.pc.in ${CMAKE_BINARY_DIR}/plexus.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/plexus.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
install(CODE "
  set(root \"\$ENV{DESTDIR}\")
  set(to \"\${root}\${CMAKE_INSTALL_PREFIX}\")
  set(man \"\${to}/${CMAKE_INSTALL_MANDIR}/man1\")
  set(bash \"\${to}/${CMAKE_INSTALL_DATADIR}/bash-completion/completions\")
  set(zsh \"\${to}/${CMAKE_INSTALL_DATADIR}/zsh/vendor-completions\")
  file(MAKE_DIRECTORY \"\${man}\" \"\${bash}\" \"\${zsh}\")
  message(STATUS \"Generating: \${man}/plexus*.1\")
  execute_process(COMMAND \"$<TARGET_FILE:plexus>\" man --dir \"\${man}\"
    RESULT_VARIABLE rc ERROR_QUIET)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR \"plexus man --dir failed: \${rc}\")
  endif()
  message(STATUS \"Generating: \${bash}/plexus\")
  execute_process(COMMAND \"$<TARGET_FILE:plexus>\" completion bash
    OUTPUT_FILE \"\${bash}/plexus\" RESULT_VARIABLE rc)
  message(STATUS \"Generating: \${zsh}/_plexus\")
  execute_process(COMMAND \"$<TARGET_FILE:plexus>\" completion zsh
    OUTPUT_FILE \"\${zsh}/_plexus\" RESULT_VARIABLE rc2)
  if(NOT rc EQUAL 0 OR NOT rc2 EQUAL 0)
    message(FATAL_ERROR \"plexus completion failed\")
  endif()
")
# Deployment recipes (dist/, docs/production.md): the systemd units, the
# users they run as, the container file and the production guide.
set(PX_SYSTEMD_DIR lib/systemd/system CACHE STRING
  "Where `make install` puts the systemd units (relative to the prefix)")
# The units name /usr/bin/plexus; installed, they name the installed command.
foreach(unit plexus-server.service plexus-agent.service)
  install(CODE "
    file(READ \"${CMAKE_SOURCE_DIR}/dist/systemd/${unit}\" text)
    string(REPLACE \"/usr/bin/plexus\" \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}/plexus\"
      text \"\${text}\")
    set(dir \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${PX_SYSTEMD_DIR}\")
    file(MAKE_DIRECTORY \"\${dir}\")
    message(STATUS \"Installing: \${dir}/${unit}\")
    file(WRITE \"\${dir}/${unit}\" \"\${text}\")
  ")
endforeach()
install(FILES ${CMAKE_SOURCE_DIR}/dist/systemd/plexus.sysusers.conf
  DESTINATION lib/sysusers.d RENAME plexus.conf)
install(FILES ${CMAKE_SOURCE_DIR}/dist/Containerfile ${CMAKE_SOURCE_DIR}/docs/production.md
  DESTINATION ${CMAKE_INSTALL_DOCDIR})
