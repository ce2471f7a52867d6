# Writes OUT (a header defining GDN_GIT_REVISION) at build time, not configure time: a binary
# records the commit it was built from, with "-dirty" when the tree had uncommitted changes to
# tracked files. The file is rewritten only when the text changes (no needless rebuilds).
set(revision "unknown")
if(GIT_EXECUTABLE)
  execute_process(COMMAND ${GIT_EXECUTABLE} rev-parse --short=12 HEAD WORKING_DIRECTORY ${SOURCE}
                  OUTPUT_VARIABLE head OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE status)
  if(status EQUAL 0 AND head)
    set(revision "${head}")
    execute_process(COMMAND ${GIT_EXECUTABLE} diff --quiet HEAD -- WORKING_DIRECTORY ${SOURCE}
                    RESULT_VARIABLE dirty ERROR_QUIET)
    if(NOT dirty EQUAL 0)
      set(revision "${revision}-dirty")
    endif()
  endif()
endif()
set(text "#pragma once\n#define GDN_GIT_REVISION \"${revision}\"\n")
if(EXISTS ${OUT})
  file(READ ${OUT} old)
endif()
if(NOT "${old}" STREQUAL "${text}")
  file(WRITE ${OUT} "${text}")
endif()
