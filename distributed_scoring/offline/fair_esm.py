"""`--model x.pt`: a fair-esm checkpoint (ESM-1b, ESM-1v, ESM-2, as `esm.pretrained` loads them) used as the
transformers folder it converts to, converted once and cached.

The cached folder is named by the file's SHA-256, so a checkpoint replaced under the same name is converted
again and two files never share a folder; a run's model (and so its fingerprint) is that folder. The
conversion (`engine.esm_checkpoint`) needs torch, which the driver never imports: it runs in a child process,
inside `build_folder`, so concurrent drivers convert once and never see half a folder.
"""

from __future__ import annotations

import hashlib
import logging
import subprocess
import sys
from pathlib import Path

from ..errors import UserError
from .models import build_folder, cache_root

logger = logging.getLogger(__name__)

SUFFIX = ".pt"  # fair-esm's checkpoints, as its hub and `load_model_and_alphabet_local` name them
DIGEST_CHARS = 16  # of the SHA-256 in the cached folder's name


def is_checkpoint(name: str) -> bool:
    """Whether --model names a fair-esm checkpoint (an existing .pt file) rather than a folder or Hub id."""
    path = Path(name).expanduser()
    return path.suffix == SUFFIX and path.is_file()


def file_digest(path: Path) -> str:
    """SHA-256 of a file's bytes (about 2 s a GB)."""
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def model_folder(name: str, cache: Path | None = None) -> str:
    """The model folder --model stands for: a fair-esm checkpoint's converted folder (converted on first use,
    under `cache_root()`/fair-esm), any other name as it is."""
    if not is_checkpoint(name):
        return name
    checkpoint = Path(name).expanduser().resolve()
    dest = (cache or cache_root()) / "fair-esm" / file_digest(checkpoint)[:DIGEST_CHARS]

    def build(folder: Path) -> None:
        logger.info("converting fair-esm checkpoint %s to a Hugging Face model (once), cached in %s", checkpoint, dest)
        convert_in_child(checkpoint, folder)

    return str(build_folder(dest, build, checkpoint.name))


def convert_in_child(checkpoint: Path, folder: Path) -> None:
    """`engine.esm_checkpoint.convert` in a child process; its one-line refusal becomes this process's, and
    anything else it raises (a bug) keeps its traceback."""
    command = [sys.executable, "-m", "distributed_scoring.engine.esm_checkpoint", str(checkpoint), str(folder)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode == 2:  # a refusal (not a fair-esm checkpoint, another architecture): its one line
        raise UserError(done.stderr.strip().splitlines()[-1])
    if done.returncode != 0:
        raise RuntimeError(f"converting fair-esm checkpoint {checkpoint} failed:\n{done.stderr}")
