# The prefill kernels, included by kernels/cuda/CMakeLists.txt once kdaguard_kernels exists: the
# dispatcher and the guard join the library (instantiations.cmake generates one translation unit
# per (K, V) shape, which finds prefill_shape.cuh through the include path below); every
# tests/<name>.cpp is a GPU conformance executable (label gpu).
file(GLOB KDAGUARD_PREFILL_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/*.cu)
target_sources(kdaguard_kernels PRIVATE ${KDAGUARD_PREFILL_SOURCES})
target_include_directories(kdaguard_kernels PRIVATE ${CMAKE_CURRENT_LIST_DIR})

if(BUILD_TESTING)
  file(GLOB KDAGUARD_PREFILL_TEST_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/tests/*.cpp)
  foreach(src IN LISTS KDAGUARD_PREFILL_TEST_SOURCES)
    get_filename_component(name ${src} NAME_WE)
    add_executable(${name} ${src})
    # tests/gpu_support.h: the GPU tests' shared helpers (device checks, CUDA-graph capture).
    target_include_directories(${name} PRIVATE ${CMAKE_CURRENT_LIST_DIR}
                               ${CMAKE_CURRENT_SOURCE_DIR}/common ${CMAKE_CURRENT_SOURCE_DIR}/tests)
    target_link_libraries(${name} PRIVATE kdaguard::kernels kdaguard_testsupport rapidcheck_gtest
                          rapidcheck GTest::gtest_main fmt::fmt CUDA::cudart_static)
    # The binaries travel to the GPU machine, whose system libstdc++ may be older.
    target_link_options(${name} PRIVATE -static-libstdc++ -static-libgcc)
    gtest_discover_tests(${name} PROPERTIES LABELS gpu DISCOVERY_MODE PRE_TEST DISCOVERY_TIMEOUT 60)
  endforeach()
endif()
