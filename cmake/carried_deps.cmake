# Header-only libraries and GoogleTest from a carried folder (scripts/carry-deps.sh), as the
# imported targets the project links: nlohmann_json, fmt (header-only mode), CLI11, Eigen, the
# Boost.Graph headers, Gloo's headers (for c10d), GTest built from its sources, and Google
# Benchmark (header and shared library) where carried.
set(_carried "${OOM_CARRIED_DEPS}")
if(NOT EXISTS "${_carried}/include/nlohmann/json.hpp")
  message(FATAL_ERROR "OOM_CARRIED_DEPS=${_carried} holds no include/nlohmann/json.hpp (make it with scripts/carry-deps.sh)")
endif()
include_directories(SYSTEM "${_carried}/include")
foreach(_lib nlohmann_json::nlohmann_json fmt::fmt CLI11::CLI11 Eigen3::Eigen)
  string(REPLACE "::" "_" _name "${_lib}")
  add_library(${_name}_carried INTERFACE IMPORTED GLOBAL)
  set_target_properties(${_name}_carried PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${_carried}/include")
  add_library(${_lib} ALIAS ${_name}_carried)
endforeach()
set_property(TARGET fmt_fmt_carried PROPERTY INTERFACE_COMPILE_DEFINITIONS FMT_HEADER_ONLY=1)
set_property(TARGET Eigen3_Eigen_carried PROPERTY INTERFACE_INCLUDE_DIRECTORIES "${_carried}/include/eigen3")
if(OOM_BUILD_TESTS AND EXISTS "${_carried}/googletest/CMakeLists.txt")
  set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
  set(BUILD_GMOCK OFF CACHE BOOL "" FORCE)
  add_subdirectory("${_carried}/googletest" "${CMAKE_BINARY_DIR}/_carried_googletest" EXCLUDE_FROM_ALL)
  if(NOT TARGET GTest::gtest)  # googletest ≥ 1.11 defines these itself
    add_library(GTest::gtest ALIAS gtest)
    add_library(GTest::gtest_main ALIAS gtest_main)
  endif()
endif()
if(EXISTS "${_carried}/lib/libbenchmark.so")
  add_library(benchmark::benchmark SHARED IMPORTED GLOBAL)
  set_target_properties(benchmark::benchmark PROPERTIES IMPORTED_LOCATION "${_carried}/lib/libbenchmark.so"
                        INTERFACE_INCLUDE_DIRECTORIES "${_carried}/include")
endif()
