# One bounded libFuzzer run for ctest: a fresh scratch corpus first (libFuzzer writes new inputs
# into its first directory), the checked-in seeds second; fails when the fuzzer finds anything.
#   cmake -DFUZZER=... -DSCRATCH=... "-DCORPUS=dir [dir ...]" -DSECONDS=... [-DDICT=...] -P run_bounded.cmake
file(REMOVE_RECURSE ${SCRATCH})
file(MAKE_DIRECTORY ${SCRATCH})
get_filename_component(artifacts ${SCRATCH} DIRECTORY)
separate_arguments(corpora UNIX_COMMAND "${CORPUS}")
set(dict_arg "")
if(DICT AND EXISTS ${DICT})
  set(dict_arg -dict=${DICT})
endif()
execute_process(
  COMMAND ${FUZZER} ${dict_arg} -max_total_time=${SECONDS} -seed=1 -timeout=30 -rss_limit_mb=2048
          -print_final_stats=1 -artifact_prefix=${artifacts}/ ${SCRATCH} ${corpora}
  RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "${FUZZER} found a failing input (exit ${result}); see the artifact in ${artifacts}")
endif()
