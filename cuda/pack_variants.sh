#!/usr/bin/env bash
# Builds kernel variants for an A/B comparison in one device call (cuda/run_variants_h200.sh):
#
#   bash cuda/pack_variants.sh base= hybrid=path/to/a.patch both=path/to/b.patch
#
# NAME=@DIR takes HEAD's binaries from the build folder DIR instead (the tree must be clean).
# Each NAME=PATCH gets a detached worktree of HEAD under /tmp/gdn-variants/NAME with PATCH
# applied (nothing for "NAME="), configured in Release like build/, and its
# cuda_chunked_bench and cuda_chunked_gpu_tests built; the worktree is removed afterwards.
# The binaries (debug info stripped, with libbenchmark beside them and VARIANT.txt saying what
# was built) go to NAME/ in one archive, .carry-chunk/variants.tar.xz (or $GDN_VARIANTS_OUT),
# written atomically.
# Why one archive: a call carries at most 64 MiB with the tracked files (about 44 MB of them),
# one variant's pack is about 9.5 MB, and the variants share all but their forward kernels,
# which one xz window over all of them stores once (four variants: 15 MB).
# Why worktrees: each variant compiles every kernel instance from its own sources, so the
# comparison runs binaries that differ only by the patch, in one call, on one clock.
set -eu
ROOT=$(git rev-parse --show-toplevel)
STAGE=/tmp/gdn-variants/stage
rm -rf "$STAGE"
mkdir -p "$ROOT/.carry-chunk" "$STAGE"
for spec in "$@"; do
  name=${spec%%=*}
  patch=${spec#*=}
  [[ $spec == *=* && $name =~ ^[A-Za-z0-9_-]+$ ]] || { echo "pack_variants: expected NAME=PATCH, got '$spec'" >&2; exit 2; }
  if [[ $patch == @* ]]; then
    # NAME=@DIR: HEAD's binaries from an existing build folder (built from a clean tree),
    # instead of building the same sources again.
    from=${patch#@}
    git -C "$ROOT" diff --quiet HEAD -- cuda reference oracle fuzz ||
      { echo "pack_variants: $name=@$from wants a clean tree (the binaries are said to be HEAD's)" >&2; exit 2; }
    mkdir -p "$STAGE/$name"
    cp "$from/cuda/cuda_chunked_gpu_tests" "$from/cuda/cuda_chunked_bench" "$from/cuda/libbenchmark.so.1debian" "$STAGE/$name/"
    strip --strip-debug "$STAGE/$name"/cuda_*
    echo "$name: $(git -C "$ROOT" rev-parse --short HEAD) (from $from)" > "$STAGE/$name/VARIANT.txt"
    continue
  fi
  dir=/tmp/gdn-variants/$name
  git -C "$ROOT" worktree remove --force "$dir" 2>/dev/null || rm -rf "$dir"
  git -C "$ROOT" worktree prune
  git -C "$ROOT" worktree add -q --detach "$dir" HEAD
  if [[ -n $patch ]]; then
    git -C "$dir" apply "$(realpath "$patch")"
  fi
  what="$name: $(git -C "$ROOT" rev-parse --short HEAD)${patch:+ + $(basename "$patch")}"
  echo "== $what"
  cmake -S "$dir" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release > "/tmp/gdn-variants/$name.configure.log"
  cmake --build "$dir/build" -j2 --target cuda_chunked_bench cuda_chunked_gpu_tests > "/tmp/gdn-variants/$name.build.log" 2>&1 ||
    { tail -30 "/tmp/gdn-variants/$name.build.log" >&2; exit 1; }
  mkdir -p "$STAGE/$name"
  cp "$dir/build/cuda/cuda_chunked_gpu_tests" "$dir/build/cuda/cuda_chunked_bench" \
    "$dir/build/cuda/libbenchmark.so.1debian" "$STAGE/$name/"
  strip --strip-debug "$STAGE/$name"/cuda_*
  echo "$what" > "$STAGE/$name/VARIANT.txt"
  git -C "$ROOT" worktree remove --force "$dir"
done
OUT=${GDN_VARIANTS_OUT:-$ROOT/.carry-chunk/variants.tar.xz}
tar -C "$STAGE" -cf - . | xz -T1 --lzma2=preset=6,dict=192MiB > "$OUT.tmp" && mv "$OUT.tmp" "$OUT"
rm -rf "$STAGE"
ls -la "$OUT"
