"""Package versions for the reproducibility signature that travels with every number.

Read from the installed distributions' metadata, so drivers record them without importing torch.
"""

from __future__ import annotations

from importlib import metadata


def package_version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, str | None]:
    """The versions a score depends on, keyed by package."""
    return {name.replace("-", "_"): package_version(name) for name in ("distributed-scoring", "transformers", "torch")}
