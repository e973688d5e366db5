# The Python package: the TVM-FFI module (src/python/*.cpp) beside a copy of the package sources.
#
# The build tree holds the package exactly as a wheel installs it, so tests need only
# PYTHONPATH=<build>/python:
#   <build>/python/ditops/*.py          symlinks to python/ditops/*.py (edits show up at once)
#   <build>/python/ditops/<subpackage>  symlinks to the subpackage folders (ditops/diffusers)
#   <build>/python/ditops/_ditops_ffi.so the module (RPATH $ORIGIN)
#   <build>/python/ditops/libditops.so.0 libditops (a symlink here, the file itself in a wheel)
# The module needs no Python headers (TVM-FFI is a C ABI), so one build serves every Python 3.
#
# DITOPS_BUILD_PYTHON defaults to ON when the Python that CMake finds can import tvm_ffi
# (pip install apache-tvm-ffi); pip install . (scikit-build-core) always builds it.

find_package(Python3 COMPONENTS Interpreter QUIET)
set(DITOPS_TVM_FFI_FOUND OFF)
if(Python3_Interpreter_FOUND)
  execute_process(
    COMMAND ${Python3_EXECUTABLE} -c
            "import tvm_ffi.libinfo as l; print(l.find_include_path()); print(l.find_dlpack_include_path()); print(l.find_libtvm_ffi())"
    OUTPUT_VARIABLE tvm_ffi_info ERROR_VARIABLE tvm_ffi_error RESULT_VARIABLE tvm_ffi_rc
    OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(tvm_ffi_rc EQUAL 0)
    string(REPLACE "\n" ";" tvm_ffi_info "${tvm_ffi_info}")
    list(GET tvm_ffi_info 0 DITOPS_TVM_FFI_INCLUDE)
    list(GET tvm_ffi_info 1 DITOPS_TVM_FFI_DLPACK_INCLUDE)
    list(GET tvm_ffi_info 2 DITOPS_TVM_FFI_LIB)
    set(DITOPS_TVM_FFI_FOUND ON)
  endif()
endif()

# AUTO (the default) decides at every configure, so installing tvm_ffi later takes effect in an
# existing build directory; ON insists, OFF skips.
set(DITOPS_BUILD_PYTHON AUTO CACHE STRING "Build the Python package's TVM-FFI module (AUTO, ON, OFF)")
set_property(CACHE DITOPS_BUILD_PYTHON PROPERTY STRINGS AUTO ON OFF)
if(DITOPS_BUILD_PYTHON STREQUAL "AUTO")
  set(DITOPS_PYTHON_MODULE ${DITOPS_TVM_FFI_FOUND})
else()
  set(DITOPS_PYTHON_MODULE ${DITOPS_BUILD_PYTHON})
endif()
if(NOT DITOPS_PYTHON_MODULE)
  # tests/CMakeLists.txt registers python_pytest as a skipped test with this reason, so ctest's
  # closing list names it too.
  if(DITOPS_BUILD_PYTHON STREQUAL "OFF")
    set(DITOPS_PYTHON_WHY "DITOPS_BUILD_PYTHON=OFF")
  elseif(Python3_Interpreter_FOUND)
    set(DITOPS_PYTHON_WHY "${Python3_EXECUTABLE} cannot import tvm_ffi: pip install apache-tvm-ffi numpy pytest "
                          "(torch and diffusers for their tests), or -DPython3_EXECUTABLE=<a python that can>")
  else()
    set(DITOPS_PYTHON_WHY "no Python 3 interpreter found")
  endif()
  message(STATUS "ditops: Python module not built (${DITOPS_PYTHON_WHY})")
  return()
endif()
if(NOT DITOPS_TVM_FFI_FOUND)
  message(FATAL_ERROR "DITOPS_BUILD_PYTHON=ON but ${Python3_EXECUTABLE} cannot import tvm_ffi "
                      "(pip install apache-tvm-ffi): ${tvm_ffi_error}")
endif()
message(STATUS "ditops: Python module with TVM-FFI ${DITOPS_TVM_FFI_LIB} (${Python3_EXECUTABLE})")

file(GLOB DITOPS_PYTHON_BINDING_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/python/*.cpp)
add_library(ditops_python MODULE ${DITOPS_PYTHON_BINDING_SOURCES})
target_include_directories(ditops_python PRIVATE ${DITOPS_TVM_FFI_INCLUDE} ${DITOPS_TVM_FFI_DLPACK_INCLUDE})
# libtvm_ffi is the one the tvm_ffi package has already loaded by the time ditops loads the
# module: linked by its soname, found through that already-loaded copy, never by a path.
target_link_libraries(ditops_python PRIVATE ditops ${DITOPS_TVM_FFI_LIB})
target_compile_options(ditops_python PRIVATE -Wall -Wextra -Wno-unused-parameter)
set(DITOPS_PYTHON_DIR ${CMAKE_BINARY_DIR}/python/ditops)
set_target_properties(ditops_python PROPERTIES
  OUTPUT_NAME _ditops_ffi PREFIX "" SUFFIX ".so"
  LIBRARY_OUTPUT_DIRECTORY ${DITOPS_PYTHON_DIR}
  BUILD_RPATH "$ORIGIN" INSTALL_RPATH "$ORIGIN" BUILD_WITH_INSTALL_RPATH ON)

# The package sources, linked into the build tree (a new .py file re-runs the glob at build time).
file(GLOB DITOPS_PYTHON_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/python/ditops/*.py)
file(MAKE_DIRECTORY ${DITOPS_PYTHON_DIR})
foreach(py ${DITOPS_PYTHON_SOURCES})
  get_filename_component(py_name ${py} NAME)
  file(CREATE_LINK ${py} ${DITOPS_PYTHON_DIR}/${py_name} SYMBOLIC)
endforeach()
# Subpackages (ditops.diffusers): the folder itself, linked, so new files in it show up too.
file(GLOB DITOPS_PYTHON_SUBPACKAGES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/python/ditops/*/__init__.py)
foreach(init ${DITOPS_PYTHON_SUBPACKAGES})
  get_filename_component(pkg_dir ${init} DIRECTORY)
  get_filename_component(pkg_name ${pkg_dir} NAME)
  file(CREATE_LINK ${pkg_dir} ${DITOPS_PYTHON_DIR}/${pkg_name} SYMBOLIC)
endforeach()
get_target_property(ditops_soversion ditops SOVERSION)
set(DITOPS_SONAME libditops.so.${ditops_soversion})
add_custom_command(TARGET ditops_python POST_BUILD
  COMMAND ${CMAKE_COMMAND} -E create_symlink $<TARGET_FILE:ditops> ${DITOPS_PYTHON_DIR}/${DITOPS_SONAME}
  COMMENT "Linking libditops beside the Python module")

# pip install . (scikit-build-core, pyproject.toml) installs only this component beside the
# package sources it copies itself: the module and the library under its soname (wheels hold
# no symlinks).
if(SKBUILD)
  install(TARGETS ditops_python LIBRARY DESTINATION ditops COMPONENT python)
  install(FILES $<TARGET_FILE:ditops> DESTINATION ditops RENAME ${DITOPS_SONAME} COMPONENT python)
endif()

# ctest's python_pytest runs pytest with this interpreter.
execute_process(COMMAND ${Python3_EXECUTABLE} -c "import pytest, numpy" RESULT_VARIABLE pytest_rc
                OUTPUT_QUIET ERROR_QUIET)
if(NOT pytest_rc EQUAL 0 AND NOT SKBUILD)
  message(WARNING "ditops: ${Python3_EXECUTABLE} cannot import pytest and numpy; the python_pytest "
                  "test will fail (pip install pytest numpy)")
endif()
