# LibTorch for backend/: PyTorch's own, from the project's virtual environment (.venv, made by
# scripts/install-deps.sh) or any python with torch (OOM_TORCH_PYTHON), located through
# torch.utils.cmake_prefix_path. Torch_DIR, when set, overrides the search.
#
# The PyPI wheel is a CUDA build: find_package(Torch) then needs the CUDA toolkit (nvcc, cudart
# headers), and c10d's NCCL process group needs nccl.h. Where both are present the backend is
# compiled with OOM_BACKEND_CUDA and OOM_BACKEND_NCCL (a GPU is needed only to run those paths).
# OOM_REQUIRE_CUDA=ON (set by CI) turns a missing CUDA or NCCL into a configure error, so a
# compile error in GPU code can never go unnoticed.
option(OOM_REQUIRE_CUDA "Fail unless the backend is built with CUDA and NCCL" OFF)
set(OOM_TORCH_PYTHON "${CMAKE_SOURCE_DIR}/.venv/bin/python" CACHE FILEPATH "Python whose torch provides LibTorch")

if(NOT Torch_DIR AND EXISTS "${OOM_TORCH_PYTHON}")
  execute_process(
    COMMAND "${OOM_TORCH_PYTHON}" -c "import torch.utils, torch; print(torch.utils.cmake_prefix_path + ';' + torch.__version__ + ';' + str(torch.version.cuda))"
    OUTPUT_VARIABLE _oom_torch_query OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _oom_torch_rc)
  if(_oom_torch_rc EQUAL 0)
    list(GET _oom_torch_query 0 _oom_torch_prefix)
    list(GET _oom_torch_query 1 OOM_TORCH_VERSION)
    list(GET _oom_torch_query 2 _oom_torch_cuda)
    set(Torch_DIR "${_oom_torch_prefix}/Torch" CACHE PATH "LibTorch's TorchConfig.cmake folder" FORCE)
    message(STATUS "LibTorch: torch ${OOM_TORCH_VERSION} (CUDA ${_oom_torch_cuda}) from ${OOM_TORCH_PYTHON}")
  endif()
endif()

# A CUDA LibTorch looks for the toolkit; point it at the standard place when nvcc is not on PATH.
if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
  set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc CACHE FILEPATH "")
  set(CUDAToolkit_ROOT /usr/local/cuda CACHE PATH "")
endif()
# The backend has no CUDA sources of its own; naming the architectures (RTX 4090, H100/H200) spares
# TorchConfig its GPU probe, which cannot run on a machine without one.
if(NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(ENV{TORCH_CUDA_ARCH_LIST} "8.9;9.0")
endif()
# TorchConfig asks for cuDNN, cuSPARSELt and NVSHMEM only to link them; the wheel ships those
# libraries itself and the backend calls none of them directly.
set(CAFFE2_USE_CUDNN OFF CACHE BOOL "")
set(USE_CUSPARSELT OFF CACHE BOOL "")

find_package(Torch QUIET)
if(NOT Torch_FOUND)
  if(OOM_REQUIRE_CUDA)
    message(FATAL_ERROR "LibTorch not found (run scripts/install-deps.sh, or set Torch_DIR)")
  endif()
  message(WARNING "LibTorch not found: backend/ is not built (run scripts/install-deps.sh, or set Torch_DIR)")
  set(OOM_WITH_TORCH OFF)
  return()
endif()

# CUDA and NCCL: compiled wherever the LibTorch is a CUDA build and nccl.h is found.
set(OOM_BACKEND_CUDA OFF)
set(OOM_BACKEND_NCCL OFF)
if(TORCH_CUDA_LIBRARIES OR TARGET torch_cuda)
  set(OOM_BACKEND_CUDA ON)
  find_path(OOM_NCCL_INCLUDE_DIR nccl.h
    HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include
    PATHS "${_oom_torch_prefix}/../../../nvidia/nccl/include" "${_oom_torch_prefix}/../../../nvidia/cu13/include")
  if(OOM_NCCL_INCLUDE_DIR)
    set(OOM_BACKEND_NCCL ON)
  endif()
endif()
if(OOM_REQUIRE_CUDA AND NOT (OOM_BACKEND_CUDA AND OOM_BACKEND_NCCL))
  message(FATAL_ERROR "OOM_REQUIRE_CUDA: LibTorch at ${Torch_DIR} gives CUDA=${OOM_BACKEND_CUDA}, NCCL=${OOM_BACKEND_NCCL} (nccl.h: ${OOM_NCCL_INCLUDE_DIR})")
endif()
message(STATUS "Backend: CUDA ${OOM_BACKEND_CUDA}, NCCL ${OOM_BACKEND_NCCL}")
