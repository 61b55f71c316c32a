"""Build hook. `pip install -e .` needs no compiler: the C++/CUDA extension builds with ninja at first use.

Ahead of time: `FASTENC_BUILD_EXT=1 pip install --no-build-isolation -e .` builds `fastenc._C` from csrc/
(CUDA sources too when torch has CUDA; architectures from FASTENC_CUDA_ARCHS, default "80;90").
"""
import os

from setuptools import setup

ext_modules, cmdclass = [], {}
if os.environ.get("FASTENC_BUILD_EXT", "0") not in ("", "0"):
    import glob

    import torch
    from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension, CUDA_HOME

    cuda = torch.version.cuda is not None and CUDA_HOME is not None
    srcs = ["csrc/bindings.cpp"] + sorted(glob.glob("csrc/cpu/*.cpp"))
    archs = [a for a in os.environ.get("FASTENC_CUDA_ARCHS", "80;90").replace(",", ";").split(";") if a]
    cxx = ["-O3", "-fopenmp"]
    if os.environ.get("FASTENC_CPU_ARCH"):
        cxx.append(f"-march={os.environ['FASTENC_CPU_ARCH']}")
    kw = dict(name="fastenc._C", include_dirs=[os.path.abspath("csrc/common"), os.path.abspath("csrc")],
              extra_link_args=["-fopenmp"])
    if cuda:
        srcs += sorted(glob.glob("csrc/*/*.cu"))
        nvcc = ["-O3", "--use_fast_math", "-lineinfo", "-DFASTENC_WITH_CUDA"]
        for a in archs:
            n = a.rstrip("a")
            nvcc += ["-gencode", f"arch=compute_{a},code=sm_{a}" if a.endswith("a") else f"arch=compute_{n},code=sm_{n}"]
        ext_modules.append(CUDAExtension(sources=srcs, extra_compile_args={"cxx": cxx + ["-DFASTENC_WITH_CUDA"], "nvcc": nvcc}, **kw))
    else:
        ext_modules.append(CppExtension(sources=srcs, extra_compile_args={"cxx": cxx}, **kw))
    cmdclass = {"build_ext": BuildExtension}

setup(ext_modules=ext_modules, cmdclass=cmdclass)
