# Fails when a test-case name holds ';'. ctest splits test names there, and a split name
# matches no case, so it would "pass" without running anything. (A FAIL_REGULAR_EXPRESSION
# of ";" cannot say this: CMake reads that property as a list, and ";" as two empty items.)
execute_process(COMMAND ${TESTS} --list-test-cases OUTPUT_VARIABLE names RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${TESTS} --list-test-cases failed")
endif()
string(ASCII 59 semicolon)
string(FIND "${names}" "${semicolon}" at)
if(NOT at EQUAL -1)
  string(REGEX MATCH "[^\n]*${semicolon}[^\n]*" name "${names}")
  message(FATAL_ERROR "a test-case name holds '${semicolon}' (write ',' instead): ${name}")
endif()
