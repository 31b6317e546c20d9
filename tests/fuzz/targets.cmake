# Reads tests/fuzz/targets.txt: OOM_FUZZ_TARGET_NAMES (target names) and OOM_FUZZ_TARGET_SOURCES
# (each target's entry source, absolute paths), shared by tests/fuzz (libFuzzer programs) and
# tests/gates (the corpus replay test).
set(OOM_FUZZ_DIR "${CMAKE_SOURCE_DIR}/tests/fuzz")
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${OOM_FUZZ_DIR}/targets.txt")
file(STRINGS "${OOM_FUZZ_DIR}/targets.txt" _oom_fuzz_lines REGEX "^[a-z]")
set(OOM_FUZZ_TARGET_NAMES "")
set(OOM_FUZZ_TARGET_SOURCES "")
foreach(_line IN LISTS _oom_fuzz_lines)
  string(REGEX MATCH "^[a-z0-9_]+" _name "${_line}")
  list(APPEND OOM_FUZZ_TARGET_NAMES "${_name}")
  list(APPEND OOM_FUZZ_TARGET_SOURCES "${OOM_FUZZ_DIR}/${_name}_fuzz.cc")
endforeach()
