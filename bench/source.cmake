# bench/source.cmake -- run at every build (cmake -P): writes OUT, a header
# that defines SW_BENCH_SOURCE as `git describe --always --dirty` of the
# tree, only when that changed (so nothing rebuilds for nothing). The bench
# prints it with its results; configure time was too early (a build dir
# configured weeks ago named a revision long gone).
find_package(Git QUIET)
set(rev "unknown")
if(GIT_FOUND)
  execute_process(COMMAND ${GIT_EXECUTABLE} describe --always --dirty
    WORKING_DIRECTORY ${SRC}
    OUTPUT_VARIABLE out OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
  if(rc EQUAL 0 AND out)
    set(rev "${out}")
  endif()
endif()
set(text "#define SW_BENCH_SOURCE \"${rev}\"\n")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
else()
  set(old "")
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUT}" "${text}")
endif()
