# Fails when a file in single_include/ differs from what tools/amalgamate.cmake makes now.
foreach(entry ckpt nn fault)
  execute_process(COMMAND ${CMAKE_COMMAND} -DROOT=${ROOT} -DENTRY=${entry} -DOUT=${FRESH}.${entry}
                          -P ${ROOT}/tools/amalgamate.cmake
                  RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "tools/amalgamate.cmake failed for ${entry}")
  endif()
  execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${FRESH}.${entry} ${ROOT}/single_include/${entry}/${entry}.hpp
                  RESULT_VARIABLE differs)
  if(differs)
    message(FATAL_ERROR "single_include/${entry}/${entry}.hpp is stale: run tools/amalgamate.sh and commit the result")
  endif()
  message(STATUS "single_include/${entry}/${entry}.hpp is up to date")
endforeach()
