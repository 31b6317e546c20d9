# The planner's include graph: each file of planner/ includes planner headers of its own layer and
# of the layers planner/CMakeLists.txt links it to, never of a later one; so the folders build as
# libraries in pipeline order, with no include cycle between them.
#   cmake -DROOT=<source dir> -P planner_layers.cmake
# Fails listing every include that breaks the order (file, line, header, the layers it may see).
#
# A file's layer is its folder, except calibration/calibration.{h,cc}: the Calibration value type,
# below the engines that price with it.
cmake_minimum_required(VERSION 3.20)
if(NOT ROOT)
  message(FATAL_ERROR "pass -DROOT=<source dir>")
endif()

# Which layers each layer may include (its own is always allowed).
set(may_plan "")
set(may_calibration_model "")
set(may_lowering plan)
set(may_engine plan lowering calibration_model)
set(may_calibration plan lowering engine calibration_model)
set(may_search plan lowering engine calibration_model)
set(layers plan calibration_model lowering engine calibration search)

function(layer_of path out)  # path relative to planner/, e.g. "engine/executor.h"
  if(path MATCHES "^calibration/calibration\\.(h|cc)$")
    set(${out} calibration_model PARENT_SCOPE)
  elseif(path MATCHES "^([a-z_]+)/")
    set(${out} ${CMAKE_MATCH_1} PARENT_SCOPE)
  else()
    set(${out} "" PARENT_SCOPE)
  endif()
endfunction()

file(GLOB_RECURSE files RELATIVE ${ROOT}/planner ${ROOT}/planner/*.h ${ROOT}/planner/*.cc)
list(SORT files)
set(violations "")
set(checked 0)
foreach(f ${files})
  layer_of(${f} from)
  if(NOT from IN_LIST layers)
    string(APPEND violations "  planner/${f}: in no layer (a folder of planner/CMakeLists.txt)\n")
    continue()
  endif()
  file(STRINGS ${ROOT}/planner/${f} lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"planner/")
  foreach(line ${lines})
    string(REGEX MATCH "\"planner/([^\"]+)\"" _ "${line}")
    set(header ${CMAKE_MATCH_1})
    layer_of(${header} to)
    math(EXPR checked "${checked} + 1")
    if(to STREQUAL from OR to IN_LIST may_${from})
      continue()
    endif()
    string(REPLACE ";" ", " allowed "${may_${from}}")
    if(allowed STREQUAL "")
      set(allowed "no other layer")
    endif()
    string(APPEND violations "  planner/${f} (${from}) includes planner/${header} (${to}); ${from} may include: ${allowed}\n")
  endforeach()
endforeach()
if(checked EQUAL 0)
  message(FATAL_ERROR "no planner include found under ${ROOT}/planner")
endif()
if(violations)
  message(FATAL_ERROR "planner includes out of layer order:\n${violations}")
endif()
list(LENGTH files n)
message(STATUS "planner layers: ${n} files, ${checked} planner includes, all in order")
