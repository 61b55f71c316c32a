"""Build hook. `pip install -e .` needs no compiler: the C++/CUDA extension builds with ninja at first use.

Ahead of time: `FASTENC_BUILD_EXT=1 pip install --no-build-isolation -e .` builds the extension's two halves
from csrc/ as two modules: `fastenc._C` (bindings.cpp + csrc/cpu/*.cpp) and, when torch has CUDA,
`fastenc._C_cuda` (bindings.cpp with -DFASTENC_WITH_CUDA + csrc/<op>/*.cpp + csrc/<op>/*.cu; architectures from
FASTENC_CUDA_ARCHS, default "80;90"). The source lists are fastenc.extension.sources(): an op's new files join
with no edit here. A failing CUDA half is reported and skipped: the cpu half is installed either way.
"""
import importlib.util
import json
import os
import sys

from setuptools import setup

HERE = os.path.dirname(os.path.abspath(__file__))


def _extension_py():
    """fastenc/extension.py (needs only torch; the package itself is not imported): the JIT build's flags."""
    spec = importlib.util.spec_from_file_location("_fastenc_extension", os.path.join(HERE, "fastenc", "extension.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def extensions(cuda: bool) -> list:
    """The cpu half, and the cuda half when `cuda`: two extensions sharing bindings.cpp (split by its #ifdefs), each
    with its own ops' sources."""
    from torch.utils.cpp_extension import CppExtension, CUDAExtension

    ext_py = _extension_py()
    cxx = ext_py.cflags(aot=True)  # -march only from FASTENC_CPU_ARCH
    kw = dict(include_dirs=[os.path.join(HERE, "csrc", "common"), os.path.join(HERE, "csrc")],
              extra_link_args=["-fopenmp"])
    rel = [os.path.relpath(s, HERE) for s in ext_py.sources("cpu")]
    exts = [CppExtension(name="fastenc._C", sources=rel, extra_compile_args={"cxx": cxx}, **kw)]
    if cuda:
        rel = [os.path.relpath(s, HERE) for s in ext_py.sources("cuda")]
        exts.append(CUDAExtension(name="fastenc._C_cuda", sources=rel,
                                  extra_compile_args={"cxx": cxx + ext_py.define_flags("cuda"),
                                                      "nvcc": ext_py.nvcc_flags()}, **kw))
    return exts


def build_ext_class():
    import torch
    from torch.utils.cpp_extension import BuildExtension

    class BuildExtWithMeta(BuildExtension):
        """Builds each half in its own temporary folder (both compile bindings.cpp), records {torch, cuda, archs}
        beside each built module (fastenc.extension checks it on load), and goes on without the cuda half when
        it fails to build."""

        failed: dict = {}  # ext name -> last line of its build error (a class per build_ext_class() call)

        def _meta_path(self, ext_name):
            return os.path.join(os.path.dirname(self.get_ext_fullpath(ext_name)),
                                ext_name.rpartition(".")[2] + ".build_meta.json")

        def build_extension(self, ext):
            temp = self.build_temp
            self.build_temp = os.path.join(temp, ext.name.rpartition(".")[2])
            cuda = ext.name.endswith("_cuda")
            try:
                super().build_extension(ext)
            except Exception as e:  # noqa: BLE001 -- any compiler/linker failure of the cuda half
                if not cuda:
                    raise
                self.failed[ext.name] = str(e).strip().splitlines()[-1:] or ["failed"]
                print(f"fastenc: the CUDA half ({ext.name}) failed to build: {self.failed[ext.name][0]}; "
                      "the cpu half is built, the cuda backend will try a JIT build at first use", file=sys.stderr)
                return
            finally:
                self.build_temp = temp
            archs = _extension_py().cuda_archs() if cuda else []
            meta = {"torch": torch.__version__, "cuda": torch.version.cuda if cuda else None, "archs": archs,
                    "with_cuda": cuda, "python": sys.version.split()[0]}
            path = self._meta_path(ext.name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                json.dump(meta, f, indent=1)
            print(f"fastenc: built {ext.name} ({'cuda ' + ';'.join(archs) if cuda else 'cpu'}), metadata in {path}")

        def get_outputs(self):
            skip = {self.get_ext_fullpath(n) for n in self.failed}
            return ([o for o in super().get_outputs() if o not in skip]
                    + [self._meta_path(e.name) for e in self.extensions if e.name not in self.failed])

    return BuildExtWithMeta


if __name__ == "__main__":
    ext_modules, cmdclass = [], {}
    if os.environ.get("FASTENC_BUILD_EXT", "0") not in ("", "0"):
        import torch
        from torch.utils.cpp_extension import CUDA_HOME

        ext_modules = extensions(cuda=torch.version.cuda is not None and CUDA_HOME is not None
                                 and os.environ.get("FASTENC_NO_CUDA_EXT", "0") in ("", "0"))
        cmdclass = {"build_ext": build_ext_class()}
    setup(ext_modules=ext_modules, cmdclass=cmdclass)
