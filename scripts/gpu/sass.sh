#!/usr/bin/env bash
# The compiled kernels without a GPU: NVRTC builds every module of one kernel source for
# sm_90a and sm_80 (the nvrtc test with AKUNU_NVRTC_KEEP), then cuobjdump (from PyPI) prints
# each sm_90a kernel's registers, spill stack, local memory and static shared memory, one row
# per (defines, kernel), and writes each module's SASS beside its cubin.
#   scripts/gpu/sass.sh FILE.cu [KERNEL-REGEX]
# Environment: AKUNU_VENV (default .venv), AKUNU_SASS_DIR (default /tmp/akunu-sass, emptied).
# One module's compile and wgmma verdict alone, in seconds: scripts/gpu/nvrtc_module.py.
set -euo pipefail
cd "$(dirname "$0")/../.."
file=${1:?usage: scripts/gpu/sass.sh FILE.cu [KERNEL-REGEX]}
pattern=${2:-.}
[ -f "crates/akunu-cuda/kernels/$file" ] || { echo "no kernel source crates/akunu-cuda/kernels/$file" >&2; exit 2; }
venv=${AKUNU_VENV:-$PWD/.venv}
dir=${AKUNU_SASS_DIR:-/tmp/akunu-sass}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
py=$venv/bin/python
nvidia_dir() { "$py" -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13"))' 2>/dev/null; }
# NVRTC as CI pins it; the oldest CUDA 13 cuobjdump and nvdisasm wheels on PyPI read its cubins.
[ -d "$(nvidia_dir)/lib" ] || "$py" -m pip install -q --disable-pip-version-check "$(grep nvidia-cuda-nvrtc scripts/ref/requirements.txt)"
for tool in cuobjdump nvdisasm; do
  [ -x "$(nvidia_dir)/bin/$tool" ] || "$py" -m pip install -q --disable-pip-version-check "nvidia-cuda-$tool==13.2.86"
done
cuobjdump=$(nvidia_dir)/bin/cuobjdump
export NVDISASM_PATH=$(nvidia_dir)/bin

rm -rf "$dir"
LD_LIBRARY_PATH=$(nvidia_dir)/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} AKUNU_REQUIRE_NVRTC=1 \
  AKUNU_NVRTC_ONLY=$file AKUNU_NVRTC_KEEP=$dir \
  cargo test --release -q -p akunu-cuda --test nvrtc > "$dir.log" 2>&1 \
  || { tail -20 "$dir.log"; exit 1; }

echo "| defines | kernel | registers | stack | local | shared |"
echo "|---|---|---|---|---|---|"
while IFS=$'\t' read -r cubin arch defines; do
  [ "$arch" = sm_90a ] || continue
  "$cuobjdump" -sass "$dir/$cubin" > "$dir/${cubin%.cubin}.sass"
  "$cuobjdump" -res-usage "$dir/$cubin" | awk -v d="${defines:--}" -v pat="$pattern" '
    /Function [^:]*:/ { name = $2; sub(/:$/, "", name) }
    /REG:/ && name ~ pat {
      for (i = 1; i <= NF; i++) { split($i, kv, ":"); v[kv[1]] = kv[2] }
      printf "| %s | %s | %s | %s | %s | %s |\n", d, name, v["REG"], v["STACK"], v["LOCAL"], v["SHARED"]
    }'
done < "$dir/modules.txt"
echo
echo "SASS per module: $dir/*.sass (modules.txt names their defines)"
