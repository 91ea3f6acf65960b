"""Which files of a Hugging Face folder ckptfs carries beside the weights (the view, convert,
serve, a stage), restated from ckptfs(5) ".ckptfs/hf/": every file at the folder's top that is
neither weights nor their index. Shares nothing with core/.

    from hf_side_files import HF_SIDE_FILES, side_files_of
    "LICENSE" in HF_SIDE_FILES      # True
"""

import os


class SideFiles:
    WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack",
               ".onnx", ".npy", ".npz", ".zst", ".tar", ".nemo", ".distcp", ".index.json",
               ".metadata")
    SIDE = (".json", ".model", ".tiktoken", ".txt", ".md", ".yaml", ".yml", ".jinja", ".py",
            ".vocab")
    DOCS = ("LICENSE", "README", "NOTICE", "USE_POLICY", "COPYING")

    def __init__(self, extra=()):
        self.extra = set(extra)

    def __contains__(self, name):
        if name in self.extra:
            return True
        if not name or name.startswith(".") or "/" in name or name.endswith(self.WEIGHTS):
            return False
        return name.endswith(self.SIDE) or name.startswith(self.DOCS)

    def __or__(self, other):
        return SideFiles(self.extra | set(other))


HF_SIDE_FILES = SideFiles()


def side_files_of(folder):
    """The side files of folder, sorted."""
    return sorted(f for f in os.listdir(folder)
                  if f in HF_SIDE_FILES and os.path.isfile(os.path.join(folder, f)))
