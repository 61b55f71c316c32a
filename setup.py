"""Build hook. `pip install -e .` needs no compiler: the C++/CUDA extension builds with ninja at first use.

Ahead of time: `FASTENC_BUILD_EXT=1 pip install --no-build-isolation -e .` builds `fastenc._C` from csrc/
(CUDA sources too when torch has CUDA; architectures from FASTENC_CUDA_ARCHS, default "80;90").
"""
import os

from setuptools import setup

ext_modules, cmdclass = [], {}
if os.environ.get("FASTENC_BUILD_EXT", "0") not in ("", "0"):
    import glob
    import sys

    import torch
    from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension, CUDA_HOME

    cuda = torch.version.cuda is not None and CUDA_HOME is not None
    srcs = ["csrc/bindings.cpp"] + sorted(glob.glob("csrc/cpu/*.cpp"))
    archs = [a for a in os.environ.get("FASTENC_CUDA_ARCHS", "80;90").replace(",", ";").split(";") if a]
    import importlib.util

    # the JIT build's compiler flags (fastenc/extension.py needs only torch; the package itself is not imported)
    spec = importlib.util.spec_from_file_location("_fastenc_extension", os.path.join("fastenc", "extension.py"))
    ext_py = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ext_py)
    cxx = ext_py.cflags(aot=True)  # -march only from FASTENC_CPU_ARCH
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
    import json

    class BuildExtWithMeta(BuildExtension):
        """Records {torch, cuda, archs} beside the built fastenc._C; fastenc.extension checks it on load."""

        def _meta_path(self):
            return os.path.join(os.path.dirname(self.get_ext_fullpath("fastenc._C")), "_C.build_meta.json")

        def run(self):
            super().run()
            meta = {"torch": torch.__version__, "cuda": torch.version.cuda if cuda else None,
                    "archs": archs if cuda else [], "with_cuda": cuda, "python": sys.version.split()[0]}
            os.makedirs(os.path.dirname(self._meta_path()), exist_ok=True)
            with open(self._meta_path(), "w") as f:
                json.dump(meta, f, indent=1)
            print(f"fastenc: built fastenc._C ({'cpu+cuda ' + ';'.join(archs) if cuda else 'cpu'}), "
                  f"metadata in {self._meta_path()}")

        def get_outputs(self):
            return super().get_outputs() + [self._meta_path()]

    cmdclass = {"build_ext": BuildExtWithMeta}

setup(ext_modules=ext_modules, cmdclass=cmdclass)
