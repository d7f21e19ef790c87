# Included by CMake right after llama.cpp's project() call when llama-cpp-python is built with
#   CMAKE_ARGS="-DCMAKE_PROJECT_llama.cpp_INCLUDE=<this file>"
# llama-cpp-python forces llama.cpp's `common` library on, but its Python bindings load only libllama and libggml.
# Turning `common` off here skips ~50 of the ~130 C++ compile steps (chat templates, argument parsing, an HTTP
# client) and cuts the first install by about a third on 2 cores.
set(LLAMA_BUILD_COMMON OFF CACHE BOOL "llama: build common utils library" FORCE)
