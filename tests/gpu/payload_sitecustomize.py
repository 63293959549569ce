# Device only: SITE/sitecustomize.py for a release unpacked from its wheels (build-payloads' wheels
# form; the release step installs it). Python reads a PYTHONPATH entry's .pth files never, and the
# machine's torchvision fails against a payload's own torch (0.5.18+ carry one, not torchvision):
# - the .pth files of this directory are read, as a site-packages directory's are (cutlass-dsl
#   puts its ``cutlass`` package on the path through one);
# - without a torchvision of the payload's own, every ``torchvision...`` import gets an empty stub
#   module (sglang imports it at start-up, for multimodal preprocessing no selftest target uses).
import importlib.abc
import importlib.machinery
import os
import site
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))


class _Anything(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return cls

    def __call__(cls, *args, **kwargs):
        return cls


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name == "torchvision" or name.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__version__ = "0.0"

        def __getattr__(attr):
            if attr.startswith("__"):
                raise AttributeError(attr)
            return _Anything(attr, (), {})

        module.__getattr__ = __getattr__
        return module

    def exec_module(self, module):
        pass


site.addsitedir(HERE)
if not os.path.isdir(os.path.join(HERE, "torchvision")):
    sys.meta_path.insert(0, _StubFinder())
