#!/usr/bin/env bash
# Packs what python/gpu/run_adapters.py needs on the GPU machine (Python 3.12, torch 2.11, no
# network) into .carry-py/ (python/gpu/README.md):
#   .carry-py/site.tar.xz        fla-core, flash-qla, tilelang, z3-solver, apache-tvm-ffi,
#                                torch-c-dlpack-ext, unpacked into one site folder
#   .carry-py/gdn_testbed.whl    the gdn_testbed cp312 wheel (its C++ core built here)
# Usage, from the repository root:
#   bash python/gpu/pack_site.sh           # both
#   bash python/gpu/pack_site.sh gdn       # only rebuild the gdn_testbed wheel (C++ changed)
# The downloaded wheels are kept in .whl-gdn/deps (ignored by git), outside what a call carries.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
what=${1:-all}
deps=.whl-gdn/deps
mkdir -p .carry-py "$deps"

# One version of each: tilelang 0.1.15 needs apache-tvm-ffi >=0.1.11,<0.1.13 and
# z3-solver >=4.13,<4.15.5; its other needs (numpy, ml-dtypes, psutil, cloudpickle, tqdm,
# typing-extensions) and fla-core's (einops) are in the GPU machine's image already.
requirements=("fla-core==0.6.0" "flash-qla==0.1.3" "tilelang==0.1.15" "z3-solver==4.15.4.0"
              "apache-tvm-ffi==0.1.12" "torch-c-dlpack-ext==0.1.5")

if [ "$what" = all ]; then
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any -d "$deps" "${requirements[@]}"
  site=$(mktemp -d)
  trap 'rm -rf "$site"' EXIT
  for w in "$deps"/fla_core-0.6.0-*.whl "$deps"/flash_qla-0.1.3-*.whl "$deps"/tilelang-0.1.15-*.whl \
           "$deps"/z3_solver-4.15.4.0-*.whl "$deps"/apache_tvm_ffi-0.1.12-*.whl "$deps"/torch_c_dlpack_ext-0.1.5-*.whl; do
    unzip -q -o "$w" -d "$site"
  done
  # The z3 command-line binary is not needed; a zip holds libz3.so and libz3.so.4.15 as two
  # copies of 22 MB (libtvm_compiler.so needs the soname libz3.so.4.15, z3's Python module
  # loads libz3.so): one file and a link.
  rm -rf "$site"/z3_solver-*.data
  rm -f "$site/z3/lib/libz3.so" && ln -s libz3.so.4.15 "$site/z3/lib/libz3.so"
  find "$site" -name __pycache__ -prune -exec rm -rf {} +
  tar -C "$site" -cf - . | xz -9e -T2 > .carry-py/site.tar.xz.tmp
  mv .carry-py/site.tar.xz.tmp .carry-py/site.tar.xz
fi

if [ "$what" = all ] || [ "$what" = gdn ]; then
  rm -f .whl-gdn/gdn_testbed-*.whl
  PYENV_VERSION=3.12.1 python3.12 -m pip wheel . --no-deps -w .whl-gdn
  cp .whl-gdn/gdn_testbed-*-cp312-cp312-*.whl .carry-py/gdn_testbed.whl
fi
du -b .carry-py/* | awk '{printf "%8.1f MiB  %s\n", $1 / 1048576, $2}'
