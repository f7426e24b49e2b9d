#!/bin/sh
# CUDA source -> C++ for the CPU emulation (cuda_emu.h): every launch
#   kernel<<<grid, block, shmem, stream>>>(args)
# becomes
#   kernel ^ sbn_emu::Cfg("kernel", grid, block, shmem, stream) ^ sbn_emu::args(args)
# and a #line keeps compiler messages pointing at the original file.
#   tests/cuda_emu/cu2cpp.sh IN.cu OUT.cpp
set -eu
{
  printf '#line 1 "%s"\n' "$1"
  perl -0pe 's/(\w+)(\s*<[^<>;]*>)?(\s*)<<<(.*?)>>>\s*\(/$1$2$3^ sbn_emu::Cfg("$1", $4) ^ sbn_emu::args(/gs' "$1"
} >"$2.tmp"
mv "$2.tmp" "$2"
