#!/usr/bin/env python3
"""One kernel module through NVRTC, without a GPU: whether it compiles and whether ptxas kept
its wgmma pipelined (the nvrtc test fails a module whose wgmma are serialised, C7520). Seconds
for one module, where the nvrtc test compiles all of a source's.

    scripts/gpu/nvrtc_module.py [--arch sm_90a] FILE.cu [NAME=VALUE ...]

FILE.cu is a path (a kernel source under crates/akunu-cuda/kernels, or an edited copy beside
its headers); the NAME=VALUE pairs are the module's defines (`scripts/gpu/sass.sh` lists each
module's in modules.txt). Run with the Python that has NVRTC's wheel (`nvidia-cuda-nvrtc`,
scripts/ref/requirements.txt), e.g. .venv/bin/python. The options mirror `ModuleKey::options`
in crates/akunu-cuda/src/compile.rs. Prints NVRTC's errors and ptxas's C7520 lines, then
"pipelined", "SERIALISED" or "FAILED"; exits 0 only for "pipelined".
"""
import ctypes
import glob
import os
import sys


def nvrtc_library():
    import nvidia

    lib_dir = os.path.join(nvidia.__path__[0], "cu13", "lib")
    found = sorted(glob.glob(os.path.join(lib_dir, "libnvrtc.so.*")))
    if not found:
        raise SystemExit(f"no libnvrtc.so in {lib_dir}: pip install nvidia-cuda-nvrtc")
    # libnvrtc loads its builtins library by name at compile time, from the loader's path.
    ctypes.CDLL(sorted(glob.glob(os.path.join(lib_dir, "libnvrtc-builtins.so.*")))[0], mode=ctypes.RTLD_GLOBAL)
    return ctypes.CDLL(found[0])


def compile_module(path, arch, defines):
    """NVRTC's result code and log for the module."""
    nv = nvrtc_library()
    with open(path, "rb") as f:
        src = f.read()
    prog = ctypes.c_void_p()
    rc = nv.nvrtcCreateProgram(ctypes.byref(prog), src, os.path.basename(path).encode(), 0, None, None)
    if rc != 0:
        raise SystemExit(f"nvrtcCreateProgram: error {rc}")
    options = [f"--gpu-architecture={arch}", "--std=c++17", "--use_fast_math", "--fmad=true",
               "-default-device", f"-I{os.path.dirname(os.path.abspath(path))}"]
    options += [f"-D{d}" for d in defines]
    encoded = [o.encode() for o in options]
    rc = nv.nvrtcCompileProgram(prog, len(encoded), (ctypes.c_char_p * len(encoded))(*encoded))
    size = ctypes.c_size_t()
    nv.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nv.nvrtcGetProgramLog(prog, log)
    nv.nvrtcDestroyProgram(ctypes.byref(prog))
    return rc, log.value.decode(errors="replace")


def main(argv):
    arch = "sm_90a"
    if argv[:1] == ["--arch"] and len(argv) > 1:
        arch, argv = argv[1], argv[2:]
    if not argv or not argv[0].endswith(".cu") or any("=" not in d for d in argv[1:]):
        raise SystemExit(__doc__)
    rc, log = compile_module(argv[0], arch, argv[1:])
    for line in log.splitlines():
        if "error" in line or "C7520" in line:
            print(line)
    if rc != 0:
        print("FAILED")
        return 1
    if "wgmma.mma_async instructions are serialized" in log:
        print("SERIALISED")
        return 1
    print("pipelined")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
