# CMake toolchain file: cross-compile tern for 64-bit ARM Linux (aarch64) on
# a Debian x86-64 host, and run what it builds (tests, ctest) under
# qemu-user. scripts/test-aarch64.sh uses it; by hand:
#
#   cmake -S . -B build/aarch64 -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake
#
# Needs (Debian packages): gcc-aarch64-linux-gnu, qemu-user (or
# qemu-user-static), and the arm64 builds of the libraries tern links, after
# `dpkg --add-architecture arm64 && apt-get update`:
#   libcmocka-dev:arm64 libpcre2-dev:arm64 libutf8proc-dev:arm64 libhwloc-dev:arm64
# Debian's cross compiler finds those multiarch packages (headers in
# /usr/include, libraries in /usr/lib/aarch64-linux-gnu) by itself.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(TERN_CROSS_TRIPLE aarch64-linux-gnu)
if(NOT CMAKE_C_COMPILER)
  set(CMAKE_C_COMPILER ${TERN_CROSS_TRIPLE}-gcc)
endif()

# Look for libraries and headers of the target only, programs of the host.
set(CMAKE_LIBRARY_ARCHITECTURE ${TERN_CROSS_TRIPLE})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)

# pkg-config: the host's binary, reading only the arm64 .pc files (the host's
# x86-64 ones would hand out the wrong libraries). Set here, so that it also
# holds when a build re-runs the configure step by itself.
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/${TERN_CROSS_TRIPLE}/pkgconfig:/usr/share/pkgconfig")
set(ENV{PKG_CONFIG_PATH} "")

# Run target binaries (ctest, try_run) under qemu. The dynamic loader and
# libc come from the arm64 multiarch packages (/lib/ld-linux-aarch64.so.1)
# or, failing that, from the cross toolchain's directory.
find_program(TERN_QEMU_AARCH64 NAMES qemu-aarch64 qemu-aarch64-static)
if(TERN_QEMU_AARCH64)
  if(EXISTS /lib/ld-linux-aarch64.so.1)
    set(CMAKE_CROSSCOMPILING_EMULATOR ${TERN_QEMU_AARCH64})
  else()
    set(CMAKE_CROSSCOMPILING_EMULATOR ${TERN_QEMU_AARCH64} -L /usr/${TERN_CROSS_TRIPLE})
  endif()
endif()
