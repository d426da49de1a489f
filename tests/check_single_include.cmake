# Fails when single_include/ckpt/ckpt.hpp differs from what tools/amalgamate.cmake makes now.
execute_process(COMMAND ${CMAKE_COMMAND} -DROOT=${ROOT} -DOUT=${FRESH} -P ${ROOT}/tools/amalgamate.cmake
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "tools/amalgamate.cmake failed")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${FRESH} ${ROOT}/single_include/ckpt/ckpt.hpp
                RESULT_VARIABLE differs)
if(differs)
  message(FATAL_ERROR "single_include/ckpt/ckpt.hpp is stale: run tools/amalgamate.sh and commit the result")
endif()
message(STATUS "single_include/ckpt/ckpt.hpp is up to date")
