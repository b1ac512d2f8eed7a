#!/usr/bin/env bash
# A CUDA 13.0 toolkit for building the CUDA engine on a machine without one and without a GPU (the 2-core
# build machine: `benchmarks/h200.sh pack-local`), from NVIDIA's PyPI wheels: nvcc, the CUDA runtime, CCCL,
# cuBLAS, NVVM and the CRT headers, laid out as CMake's FindCUDAToolkit and nvcc expect (bin, include, nvvm,
# lib64), with a stub libcuda.so.1 in lib64/stubs for the link where no driver is (every driver entry point of
# cuda.h, each returning 0: enough to link and to print --version, never to run a kernel).
#
#   scripts/cuda_toolkit_pypi.sh DIR      the toolkit into DIR (DIR/venv holds the wheels); then
#   export CUDAToolkit_ROOT=DIR CUDACXX=DIR/bin/nvcc PATH=DIR/bin:$PATH
#   DEV=1 PORTABLE=1 bash benchmarks/h200.sh pack-local
#
# 13.0 as the device's driver (580, CUDA 13.0) runs it; a cold developer build took 42 minutes on 2 cores
# (2026-12-07), a rebuild after one changed .cu file a minute or two with ccache. Idempotent.
set -euo pipefail
dir=${1:?usage: scripts/cuda_toolkit_pypi.sh DIR}
version=${CUDA_WHEELS:-13.0.*}
mkdir -p "$dir" && dir=$(cd "$dir" && pwd)
[ -x "$dir/venv/bin/pip" ] || python3 -m venv "$dir/venv"
"$dir/venv/bin/pip" install -q "nvidia-cuda-nvcc==$version" "nvidia-cuda-runtime==$version" "nvidia-cuda-cccl==$version" \
    "nvidia-cublas==$version" "nvidia-nvvm==$version" "nvidia-cuda-crt==$version"
wheels=$(ls -d "$dir"/venv/lib/python3*/site-packages/nvidia/cu13)
# nvcc finds its toolkit from its own (resolved) path, TOP = its bin/..: lib64 must be there too, so the wheels'
# folder gets a lib64 that is DIR's (the wheels ship lib/, without the unversioned names a link asks for)
mkdir -p "$dir/lib64/stubs"
for f in "$wheels"/lib/*; do ln -sfn "$f" "$dir/lib64/$(basename "$f")"; done
for lib in cudart cublas cublasLt; do ln -sfn "lib$lib.so.13" "$dir/lib64/lib$lib.so"; done
ln -sfn "$dir/lib64" "$wheels/lib64"
for d in bin include nvvm; do ln -sfn "$wheels/$d" "$dir/$d"; done
gcc -E -P "$wheels/include/cuda.h" | grep -oE '\bcu[A-Za-z0-9_]+ *\(' | sed 's/ *($//' | sort -u |
    awk '{print "int " $1 "(void) { return 0; }"}' > "$dir/lib64/stubs/libcuda-stub.c"
gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$dir/lib64/stubs/libcuda.so.1" "$dir/lib64/stubs/libcuda-stub.c"
ln -sfn libcuda.so.1 "$dir/lib64/stubs/libcuda.so"
"$dir/bin/nvcc" --version | tail -n 1
echo "export CUDAToolkit_ROOT=$dir CUDACXX=$dir/bin/nvcc PATH=$dir/bin:\$PATH"
