# Included by CMake right after llama.cpp's project() call when llama-cpp-python is built with
#   CMAKE_ARGS="-DCMAKE_PROJECT_llama.cpp_INCLUDE=<this file>"

# 1. llama-cpp-python forces llama.cpp's `common` library on, but its Python bindings load only libllama and libggml.
# Turning `common` off here skips ~50 of the ~130 C++ compile steps (chat templates, argument parsing, an HTTP
# client) and cuts the first install by about a third on 2 cores.
set(LLAMA_BUILD_COMMON OFF CACHE BOOL "llama: build common utils library" FORCE)

# 2. This machine's instruction sets, except AMX. ggml's default (GGML_NATIVE, i.e. -march=native) also compiles
# its AMX matrix kernels when the CPU lists AMX, and some virtual machines list AMX without enabling its register
# state: the first matrix multiply then dies with SIGILL (`tilezero`, seen on a 2-core cloud VM). So we name the
# sets /proc/cpuinfo lists, one ggml option each, and leave AMX off; a 135M model gains nothing from it.
if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$" AND EXISTS "/proc/cpuinfo" AND NOT CMAKE_CROSSCOMPILING)
    file(STRINGS "/proc/cpuinfo" _nemo_gym_cpu_flags REGEX "^flags" LIMIT_COUNT 1)
    string(REPLACE "\t" " " _nemo_gym_cpu_flags "${_nemo_gym_cpu_flags} ")
    set(GGML_NATIVE OFF CACHE BOOL "ggml: optimize the build for the current system" FORCE)
    foreach(_pair "SSE42:sse4_2" "F16C:f16c" "FMA:fma" "BMI2:bmi2" "AVX:avx" "AVX2:avx2" "AVX_VNNI:avx_vnni"
                  "AVX512:avx512f" "AVX512_VBMI:avx512vbmi" "AVX512_VNNI:avx512_vnni" "AVX512_BF16:avx512_bf16")
        string(REPLACE ":" ";" _pair "${_pair}")
        list(GET _pair 0 _option)
        list(GET _pair 1 _flag)
        if(_nemo_gym_cpu_flags MATCHES " ${_flag} ")
            set(GGML_${_option} ON CACHE BOOL "ggml: enable ${_option} (from /proc/cpuinfo)" FORCE)
        else()
            set(GGML_${_option} OFF CACHE BOOL "ggml: enable ${_option} (from /proc/cpuinfo)" FORCE)
        endif()
    endforeach()
    # ggml's AVX512 option also turns on -mavx512cd/vl/dq/bw: keep it only when the CPU has all of them.
    foreach(_flag avx512cd avx512vl avx512dq avx512bw)
        if(NOT _nemo_gym_cpu_flags MATCHES " ${_flag} ")
            set(GGML_AVX512 OFF CACHE BOOL "ggml: enable AVX512F" FORCE)
        endif()
    endforeach()
    foreach(_amx AMX_TILE AMX_INT8 AMX_BF16)
        set(GGML_${_amx} OFF CACHE BOOL "ggml: enable ${_amx}" FORCE)
    endforeach()
endif()
