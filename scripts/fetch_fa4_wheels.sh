#!/usr/bin/env bash
# On the development machine: download flash-attn 4 and what it needs for the GPU machine (Python 3.12,
# manylinux x86-64; shared/GPU.md), in two halves under 64 MB each (.fa4a, .fa4b; both git-ignored) so
# that two device calls made back to back can carry them. Then:
#   call 1: carry [".whl", ".fa4a"], command: bash scripts/gpu_session.sh fa4a ...
#   call 2: carry [".whl", ".fa4b"], command: bash scripts/gpu_session.sh fa4b fa4 ...
set -eu
cd "$(dirname "$0")/.."
for d in .fa4a .fa4b; do grep -qx "/$d/" .git/info/exclude || echo "/$d/" >> .git/info/exclude; done
rm -rf .fa4a .fa4b /tmp/fa4dl && mkdir -p .fa4a .fa4b /tmp/fa4dl
P="--no-deps --only-binary=:all: --python-version 3.12 --implementation cp"
for n in 17 24 27 28 31 34 35; do P="$P --platform manylinux_2_${n}_x86_64"; done
P="$P --platform manylinux2014_x86_64"
for pkg in flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1 \
  nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 apache-tvm-ffi torch-c-dlpack-ext \
  quack-kernels; do
  python3 -m pip download -q $P -d /tmp/fa4dl "$pkg"
done
big=$(ls /tmp/fa4dl/nvidia_cutlass_dsl_libs_cu13-*.whl)
for w in /tmp/fa4dl/*.whl; do [ "$w" = "$big" ] || cp "$w" .fa4a/; done
split -b 40000000 "$big" /tmp/fa4dl/cu13.part.
mv /tmp/fa4dl/cu13.part.aa .fa4a/ && mv /tmp/fa4dl/cu13.part.a[b-z] .fa4b/
basename "$big" > .fa4b/cu13.name
du -sh .fa4a .fa4b
