# `cmake --install BUILD --prefix P` and the Python wheel (pyproject.toml, scikit-build-core):
#
#   P/bin/oom                      the command; finds P/share/oom through its own location
#   P/lib/oom/liboom_torch.so      the backend plugin, where this build has one (cli/backend_plugin.cc)
#   P/share/oom/{configs,experiments,traces/paper,backend/data}   the shipped data (costmodel/config_paths.h)
#   P/share/oom/notebooks          the notebooks, as examples
#   P/lib/pythonX.Y/site-packages/oom   the Python package (python/oom/)
#   P/include/oom, P/lib/liboom_*.a, P/lib/cmake/oom   find_package(oom): oom::costmodel, oom::traces,
#                                  oom::planner, oom::experiments, oom::sim for a C++ program that
#                                  embeds the planner
#
# In a wheel (SKBUILD) the package holds everything: oom/bin/oom, oom/lib/liboom_torch.so,
# oom/share/oom/..., and the `oom` console script (python/oom/_cli.py) runs oom/bin/oom.
include(GNUInstallDirs)

if(SKBUILD)
  set(OOM_INSTALL_BINDIR oom/bin)
  set(OOM_INSTALL_PLUGINDIR oom/lib)
  set(OOM_INSTALL_DATADIR oom/share/oom)
  set(OOM_INSTALL_PYTHONDIR oom)
else()
  set(OOM_INSTALL_BINDIR ${CMAKE_INSTALL_BINDIR})
  set(OOM_INSTALL_PLUGINDIR ${CMAKE_INSTALL_LIBDIR}/oom)
  set(OOM_INSTALL_DATADIR ${CMAKE_INSTALL_DATADIR}/oom)
  if(Python_VERSION_MAJOR)
    set(_oom_py_default ${CMAKE_INSTALL_LIBDIR}/python${Python_VERSION_MAJOR}.${Python_VERSION_MINOR}/site-packages)
  else()
    set(_oom_py_default ${CMAKE_INSTALL_LIBDIR}/python3/site-packages)
  endif()
  set(OOM_INSTALL_PYTHONDIR "${_oom_py_default}/oom" CACHE STRING "Where cmake --install puts the Python package oom (relative to the prefix)")
endif()

install(TARGETS oom RUNTIME DESTINATION ${OOM_INSTALL_BINDIR} COMPONENT oom)
if(TARGET oom_torch)
  # LibTorch's folder on the RPATH: the torch package beside ours in a wheel, else the LibTorch
  # this build linked. INSTALL_RPATH_USE_LINK_PATH keeps only link folders outside the project, and
  # the project's own .venv (scripts/install-deps.sh) lies inside it: LibTorch's folder is named.
  set_target_properties(oom_torch PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)
  if(SKBUILD)
    set_property(TARGET oom_torch APPEND PROPERTY INSTALL_RPATH "$ORIGIN/../../torch/lib")
  elseif(TORCH_INSTALL_PREFIX)
    set_property(TARGET oom_torch APPEND PROPERTY INSTALL_RPATH "${TORCH_INSTALL_PREFIX}/lib")
  endif()
  install(TARGETS oom_torch LIBRARY DESTINATION ${OOM_INSTALL_PLUGINDIR} COMPONENT oom)
endif()

install(DIRECTORY configs experiments DESTINATION ${OOM_INSTALL_DATADIR} COMPONENT oom
        FILES_MATCHING PATTERN "*.json" PATTERN "*.jsonl" PATTERN "*.csv" PATTERN "*.md" PATTERN "*.png")
install(DIRECTORY traces/paper DESTINATION ${OOM_INSTALL_DATADIR}/traces COMPONENT oom)
install(FILES backend/data/corpus.txt DESTINATION ${OOM_INSTALL_DATADIR}/backend/data COMPONENT oom)
install(DIRECTORY notebooks/ DESTINATION ${OOM_INSTALL_DATADIR}/notebooks COMPONENT oom FILES_MATCHING PATTERN "*.ipynb" PATTERN "*.md")

if(TARGET oom_python)
  install(TARGETS oom_python LIBRARY DESTINATION ${OOM_INSTALL_PYTHONDIR} COMPONENT oom)
  install(FILES python/oom/__init__.py python/oom/_cli.py DESTINATION ${OOM_INSTALL_PYTHONDIR} COMPONENT oom)
  install(FILES python/oom_plots.py DESTINATION ${OOM_INSTALL_PYTHONDIR} RENAME plots.py COMPONENT oom)
endif()

# The CMake package of the simulator libraries (not in a wheel, nor with carried headers, whose
# targets are no imported ones).
if(NOT SKBUILD AND NOT OOM_CARRIED_DEPS AND OOM_SIMULATOR)
  include(CMakePackageConfigHelpers)
  set(_oom_libs oom_costmodel oom_traces ${OOM_PLANNER_LAYERS} oom_planner oom_experiments)
  if(TARGET oom_sim)
    list(APPEND _oom_libs oom_sim)
  endif()
  foreach(lib ${_oom_libs})
    string(REPLACE "oom_" "" short ${lib})
    set_target_properties(${lib} PROPERTIES EXPORT_NAME ${short})
  endforeach()
  install(TARGETS ${_oom_libs} EXPORT oomTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
  foreach(dir costmodel traces planner experiments sim)
    if(dir STREQUAL "sim" AND NOT TARGET oom_sim)
      continue()
    endif()
    install(DIRECTORY ${dir}/ DESTINATION ${OOM_INSTALL_INCLUDEDIR}/${dir} COMPONENT dev FILES_MATCHING PATTERN "*.h")
  endforeach()
  set(OOM_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/oom)
  install(EXPORT oomTargets NAMESPACE oom:: DESTINATION ${OOM_INSTALL_CMAKEDIR} COMPONENT dev)
  set(OOM_PACKAGE_HAS_SIM OFF)
  if(TARGET oom_sim)
    set(OOM_PACKAGE_HAS_SIM ON)
  endif()
  configure_package_config_file(cmake/oomConfig.cmake.in ${CMAKE_CURRENT_BINARY_DIR}/oomConfig.cmake
                                INSTALL_DESTINATION ${OOM_INSTALL_CMAKEDIR} PATH_VARS OOM_INSTALL_DATADIR)
  write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/oomConfigVersion.cmake COMPATIBILITY SameMinorVersion)
  install(FILES ${CMAKE_CURRENT_BINARY_DIR}/oomConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/oomConfigVersion.cmake
          DESTINATION ${OOM_INSTALL_CMAKEDIR} COMPONENT dev)
endif()
