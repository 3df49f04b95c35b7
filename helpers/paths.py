"""Where things live: the project root, the kernel sources, recorded data, the cache."""
import os
from pathlib import Path

def _find_root() -> Path:
    """The project: $BOOK_ROOT, else beside this package (an editable install or a
    checkout), else the nearest folder above the working directory with _toc.yml."""
    if os.environ.get("BOOK_ROOT"):
        return Path(os.environ["BOOK_ROOT"]).resolve()
    beside = Path(__file__).resolve().parent.parent
    if (beside / "kernels").is_dir():
        return beside
    for folder in (Path.cwd(), *Path.cwd().parents):
        if (folder / "_toc.yml").is_file():
            return folder
    return beside


ROOT = _find_root()
KERNELS = ROOT / "kernels"
DATA = ROOT / "book" / "data"


def cache_dir() -> Path:
    """Compiled kernels are cached here (override with BOOK_CACHE_DIR)."""
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "memory-bound-book"
    path = Path(os.environ.get("BOOK_CACHE_DIR", default))
    path.mkdir(parents=True, exist_ok=True)
    return path


def kernel_path(name) -> Path:
    """A kernel source by file name ("copy.cu") or by path."""
    path = Path(name)
    if not path.is_absolute() and not path.exists():
        # relative to the project ("kernels/copy.cu") or to kernels/ ("copy.cu")
        path = ROOT / path if (ROOT / path).is_file() else KERNELS / path
    if not path.is_file():
        available = ", ".join(sorted(p.name for p in KERNELS.glob("*.cu")))
        raise FileNotFoundError(f"no kernel source {name!r}; kernels/ holds: {available}")
    return path


def display_path(path: Path) -> str:
    """A path as the reader knows it: relative to the project when it is inside it."""
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return str(path)
