#!/usr/bin/env bash
# On the development machine: download flash-attn 4 and what it needs for the GPU machine (Python 3.12,
# manylinux x86-64; shared/GPU.md), in three parts of at most 40 MB (.fa4a, .fa4b, .fa4c; git-ignored): a
# device call carries 64 MiB with the working tree (about 20 MB) and .whl, so three calls made back to
# back carry them. Then:
#   call 1: carry [".whl", ".fa4a"], command: bash scripts/gpu_session.sh fa4a ...
#   call 2: carry [".whl", ".fa4b"], command: bash scripts/gpu_session.sh fa4b ...
#   call 3: carry [".whl", ".fa4c"], command: bash scripts/gpu_session.sh fa4c fa4 ...
set -eu
cd "$(dirname "$0")/.."
for d in .fa4a .fa4b .fa4c; do grep -qx "/$d/" .git/info/exclude || echo "/$d/" >> .git/info/exclude; done
rm -rf .fa4a .fa4b .fa4c /tmp/fa4dl && mkdir -p .fa4a .fa4b .fa4c /tmp/fa4dl
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
# the small wheels (about 10 MB) and the first 30 MB of the large one, then 40 MB, then the rest
head -c 30000000 "$big" > .fa4a/cu13.part.aa
tail -c +30000001 "$big" | split -b 40000000 - /tmp/fa4dl/cu13.part.
mv /tmp/fa4dl/cu13.part.aa .fa4b/cu13.part.ab && mv /tmp/fa4dl/cu13.part.ab .fa4c/cu13.part.ac
basename "$big" > .fa4c/cu13.name
du -sh .fa4a .fa4b .fa4c
