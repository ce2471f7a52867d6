#!/usr/bin/env bash
# Builds kernel variants for an A/B comparison in one device call (cuda/run_variants_h200.sh):
#
#   bash cuda/pack_variants.sh base= hybrid=path/to/a.patch both=path/to/b.patch
#
# Each NAME=PATCH gets a detached worktree of HEAD under /tmp/gdn-variants/NAME with PATCH
# applied (nothing for "NAME="), configured in Release like build/, and its
# cuda_chunked_bench and cuda_chunked_gpu_tests built and packed with libbenchmark into
# .carry-chunk/variant_NAME.tar.xz (cuda/pack.sh; about 11 MB each, and one call carries at
# most 64 MiB). The worktree is removed afterwards; stale variant packs are not.
# Why worktrees: each variant compiles every kernel instance from its own sources, so the
# comparison runs binaries that differ only by the patch, in one call, on one clock.
set -eu
ROOT=$(git rev-parse --show-toplevel)
mkdir -p "$ROOT/.carry-chunk" /tmp/gdn-variants
for spec in "$@"; do
  name=${spec%%=*}
  patch=${spec#*=}
  [[ $spec == *=* && -n $name ]] || { echo "pack_variants: expected NAME=PATCH, got '$spec'" >&2; exit 2; }
  dir=/tmp/gdn-variants/$name
  git -C "$ROOT" worktree remove --force "$dir" 2>/dev/null || rm -rf "$dir"
  git -C "$ROOT" worktree add -q --detach "$dir" HEAD
  if [[ -n $patch ]]; then
    git -C "$dir" apply "$(realpath "$patch")"
  fi
  echo "== $name: $(git -C "$dir" rev-parse --short HEAD)${patch:+ + $patch}"
  cmake -S "$dir" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release > "/tmp/gdn-variants/$name.configure.log"
  cmake --build "$dir/build" -j2 --target cuda_chunked_bench cuda_chunked_gpu_tests > "/tmp/gdn-variants/$name.build.log" 2>&1 ||
    { tail -30 "/tmp/gdn-variants/$name.build.log" >&2; exit 1; }
  bash "$ROOT/cuda/pack.sh" "$ROOT/.carry-chunk/variant_$name.tar.xz" "$dir/build" \
    cuda_chunked_gpu_tests cuda_chunked_bench libbenchmark.so.1debian
  git -C "$ROOT" worktree remove --force "$dir"
done
