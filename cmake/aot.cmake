# Prebuilt (aot) kernels: the generator writes one CUDA unit with an extern "C" entry per
# prebuilt template key, nvcc compiles it into one fatbin (sm_90a, sm_100a, sm_120a), and the
# fatbin is embedded in libditops with its key table. Without nvcc (or with DITOPS_BUILD_AOT=OFF)
# the library takes the empty table tools/aot_table_empty.cpp, and the
# aot entries report "built without prebuilt kernels".
set(DITOPS_AOT_TABLE ${CMAKE_BINARY_DIR}/generated/aot_table.cpp)
find_program(DITOPS_NVCC nvcc HINTS ${DITOPS_CUDA_ROOT}/bin ${CUDAToolkit_BIN_DIR} /usr/local/cuda/bin)
if(DITOPS_BUILD_AOT AND DITOPS_NVCC)
  add_executable(ditops_aotgen tools/aotgen.cpp tools/aot_table_empty.cpp $<TARGET_OBJECTS:ditops_objects>)
  target_include_directories(ditops_aotgen PRIVATE ${CMAKE_SOURCE_DIR}/include ${CMAKE_SOURCE_DIR}/src
                             ${CMAKE_SOURCE_DIR})
  target_link_libraries(ditops_aotgen PRIVATE Threads::Threads ${CMAKE_DL_LIBS})
  set(aot_cu ${CMAKE_BINARY_DIR}/generated/aot_kernels.cu)
  set(aot_fatbin ${CMAKE_BINARY_DIR}/generated/aot_kernels.fatbin)
  set(gencode "")
  foreach(arch ${DITOPS_AOT_ARCHS})
    list(APPEND gencode "-gencode=arch=compute_${arch},code=sm_${arch}")
  endforeach()
  add_custom_command(OUTPUT ${aot_cu}
    COMMAND ditops_aotgen source ${aot_cu}
    DEPENDS ditops_aotgen COMMENT "Generating the prebuilt kernel unit")
  # nvcc flags mirror the JIT's NVRTC flags (exact division/sqrt, no ftz, FMA contraction on).
  add_custom_command(OUTPUT ${aot_fatbin}
    COMMAND ${DITOPS_NVCC} -fatbin -std=c++17 -I${CMAKE_SOURCE_DIR}/kernels --fmad=true --ftz=false
            --prec-div=true --prec-sqrt=true ${gencode} -o ${aot_fatbin} ${aot_cu}
    DEPENDS ${aot_cu} ${DITOPS_KERNEL_SOURCES}
    COMMENT "nvcc: prebuilt kernels for ${DITOPS_AOT_ARCHS}")
  add_custom_command(OUTPUT ${DITOPS_AOT_TABLE}
    COMMAND ditops_aotgen table ${DITOPS_AOT_TABLE} ${aot_fatbin}
    DEPENDS ditops_aotgen ${aot_fatbin} COMMENT "Embedding the prebuilt fatbin")
  message(STATUS "ditops: prebuilt kernels for ${DITOPS_AOT_ARCHS} with ${DITOPS_NVCC}")
else()
  set(DITOPS_AOT_TABLE ${CMAKE_SOURCE_DIR}/tools/aot_table_empty.cpp)
  message(STATUS "ditops: built without prebuilt kernels")
endif()
target_sources(ditops PRIVATE ${DITOPS_AOT_TABLE})
